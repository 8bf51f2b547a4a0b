"""ALCE-style prompt templates of the CaLM loop; every template is a ``str.format`` string the caller may replace.

Fields each template may use (any other field is refused when :class:`PromptTemplates` is built):

- ``answer`` (main LM, first iteration): ``{query}``, ``{documents}``.
- ``verifier`` (small LM, the documents the answer cites, nothing else): ``{query}``, ``{documents}``.
- ``refine`` (main LM, later iterations): ``{query}``, ``{documents}`` (the next batch of the pool),
  ``{statements}`` (the corroborated statements of the previous answer, one per line, with their citations),
  ``{previous_answer}``.
- ``document`` (one document inside ``{documents}``): ``{number}`` (1-based), ``{title}``, ``{text}``;
  ``document_untitled`` is used instead when a document has no title.

Documents keep one number per query for the whole run: the pool's first batch is ``[1]..[k]``, the next batch
``[k+1]..[2k]``, and so on, so the citations of corroborated statements stay valid in refined answers. The verifier
sees the cited documents renumbered ``[1]..[m]`` (it does not cite).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from fastnli.calm.documents import Document

__all__ = ["ANSWER_TEMPLATE", "DOCUMENT_TEMPLATE", "DOCUMENT_UNTITLED_TEMPLATE", "PromptTemplates", "REFINE_TEMPLATE",
           "VERIFIER_TEMPLATE"]

#: ALCE's instruction (Gao et al., 2023), with its document and answer layout.
ANSWER_TEMPLATE = (
    "Instruction: Write an accurate, engaging, and concise answer for the given question using only the provided "
    "search results (some of which might be irrelevant) and cite them properly. Use an unbiased and journalistic "
    "tone. Always cite for any factual claim. When citing several search results, use [1][2][3]. Cite at least one "
    "document and at most three documents in each sentence. If multiple documents support the sentence, only cite a "
    "minimum sufficient subset of the documents.\n\n"
    "Question: {query}\n\n"
    "{documents}\n"
    "Answer:"
)

VERIFIER_TEMPLATE = (
    "Instruction: Answer the given question using only the information in the documents below. Do not use any "
    "other knowledge. If the documents do not contain the answer, say so. Be concise; no citations are needed.\n\n"
    "Question: {query}\n\n"
    "{documents}\n"
    "Answer:"
)

REFINE_TEMPLATE = (
    "Instruction: Write an accurate, engaging, and concise answer for the given question using only the provided "
    "search results (some of which might be irrelevant) and cite them properly. Use an unbiased and journalistic "
    "tone. Always cite for any factual claim. When citing several search results, use [1][2][3]. Cite at least one "
    "document and at most three documents in each sentence. If multiple documents support the sentence, only cite a "
    "minimum sufficient subset of the documents.\n"
    "A previous answer was checked against the documents it cited. The statements below were confirmed: keep them "
    "with their citations, drop everything else from the previous answer, and complete the answer with the new "
    "search results.\n\n"
    "Question: {query}\n\n"
    "Confirmed statements:\n{statements}\n\n"
    "{documents}\n"
    "Answer:"
)

DOCUMENT_TEMPLATE = "Document [{number}](Title: {title}): {text}"
DOCUMENT_UNTITLED_TEMPLATE = "Document [{number}]: {text}"

_FIELDS = {
    "answer": {"query", "documents"},
    "verifier": {"query", "documents"},
    "refine": {"query", "documents", "statements", "previous_answer"},
    "document": {"number", "title", "text"},
    "document_untitled": {"number", "title", "text"},
}

#: What ``{statements}`` holds when no statement of the previous answer was corroborated.
NO_STATEMENTS = "(none)"


def _fields(template: str) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


@dataclass(frozen=True)
class PromptTemplates:
    """The templates of one CaLM run (defaults: ALCE's answer prompt and the verifier/refine prompts above).

    Raises:
        TypeError: a template is not a str.
        ValueError: a template uses a field it does not get, or is not a valid format string.
    """

    answer: str = ANSWER_TEMPLATE
    verifier: str = VERIFIER_TEMPLATE
    refine: str = REFINE_TEMPLATE
    document: str = DOCUMENT_TEMPLATE
    document_untitled: str = DOCUMENT_UNTITLED_TEMPLATE

    def __post_init__(self) -> None:
        for name, allowed in _FIELDS.items():
            template = getattr(self, name)
            if not isinstance(template, str):
                raise TypeError(f"prompt template {name!r} must be a str; got {type(template).__name__}")
            try:
                used = _fields(template)
            except ValueError as exc:
                raise ValueError(f"prompt template {name!r} is not a valid str.format template ({exc}); write "
                                 "literal braces as {{ and }}") from None
            unknown = used - allowed
            if unknown:
                raise ValueError(f"prompt template {name!r} uses unknown field(s) {sorted(unknown)}; available fields: "
                                 f"{sorted(allowed)}")

    def format_documents(self, docs: Sequence[Document], first_number: int = 1) -> str:
        """Number ``docs`` from ``first_number`` and format them one per line."""
        lines = []
        for n, d in enumerate(docs, start=first_number):
            template = self.document if d.title else self.document_untitled
            lines.append(template.format(number=n, title=d.title, text=d.text))
        return "\n".join(lines) + ("\n" if lines else "")

    def answer_prompt(self, query: str, documents: str) -> str:
        return self.answer.format(query=query, documents=documents)

    def verifier_prompt(self, query: str, documents: str) -> str:
        return self.verifier.format(query=query, documents=documents)

    def refine_prompt(self, query: str, documents: str, statements: Sequence[str], previous_answer: str) -> str:
        block = "\n".join(f"- {s}" for s in statements) if statements else NO_STATEMENTS
        return self.refine.format(query=query, documents=documents, statements=block, previous_answer=previous_answer)
