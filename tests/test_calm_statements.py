"""Statement split, citation parsing, prompt templates, documents and ROUGE-L of the CaLM package (no engine)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastnli.calm import Document, PromptTemplates, parse_citations, rouge_l, split_statements, strip_citations
from fastnli.calm.documents import as_documents, estimate_tokens, pair_overflows, premise_text
from fastnli.calm.statements import format_citations, split_sentences


def test_sentences_with_alce_citations() -> None:
    out = split_statements("Paris is the capital of France [1][2]. It has 2.1 million people [3].", 3)
    assert [(s.text, s.citations, s.invalid_citations) for s in out] == [
        ("Paris is the capital of France.", (0, 1), ()),
        ("It has 2.1 million people.", (2,), ()),
    ]
    assert out[0].raw == "Paris is the capital of France [1][2]."
    assert out[0].num_citations == 2


def test_markers_after_the_full_stop_belong_to_the_sentence_before() -> None:
    out = split_statements("Paris is big. [1] It is old. [2][9]", 3)
    assert [(s.text, s.citations, s.invalid_citations) for s in out] == [
        ("Paris is big.", (0,), ()), ("It is old.", (1,), (9,))]


def test_abbreviations_initials_and_decimals_do_not_split() -> None:
    out = split_statements("Dr. Smith met J. K. Rowling in the U.S. in 1999 [1]. Pi is 3.14 [2].")
    assert [s.text for s in out] == ["Dr. Smith met J. K. Rowling in the U.S. in 1999.", "Pi is 3.14."]


def test_list_items_headers_and_marker_forms() -> None:
    answer = "Reasons:\n- Cheap [1]\n* Fast [2, 3]\n1. Third item [0]\n2) Fourth [1-3]\n\nDone [4]."
    out = split_statements(answer, 3)
    assert [(s.text, s.citations, s.invalid_citations) for s in out] == [
        ("Cheap", (0,), ()), ("Fast", (1, 2), ()), ("Third item", (), (0,)), ("Fourth", (0, 1, 2), ()),
        ("Done.", (), (4,))]


def test_cjk_terminators() -> None:
    out = split_statements("東京は首都です[1]。大阪は大きい[2]。", 2)
    assert [(s.text, s.citations) for s in out] == [("東京は首都です。", (0,)), ("大阪は大きい。", (1,))]


def test_marker_only_answers_and_empty_text() -> None:
    assert split_statements("") == []
    assert split_statements("[1][2]") == []
    assert split_sentences("  \n\n ") == []


def test_parse_citations_reports_out_of_range_as_written() -> None:
    assert parse_citations("a [2][1][2] b [7] [0]", 5) == ([1, 0], [7, 0])
    assert parse_citations("a [12]") == ([11], [])
    assert parse_citations("no markers [x] [citation needed]") == ([], [])


def test_strip_and_format_citations() -> None:
    assert strip_citations("Paris [1][2] is big [3].") == "Paris is big."
    assert format_citations([0, 2]) == "[1][3]"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab .!?[]12-,\n")), max_size=60), st.integers(0, 4))
def test_split_never_raises_and_strips_all_markers(text: str, n: int) -> None:
    for s in split_statements(text, n):
        assert not re.search(r"\[\d+\]", s.text)
        assert all(0 <= c < n for c in s.citations)
        assert all(c < 1 or c > n for c in s.invalid_citations)


def test_prompt_templates_number_documents_and_refuse_unknown_fields() -> None:
    t = PromptTemplates()
    docs = [Document("Paris is in France.", "Paris"), Document("Untitled text.")]
    block = t.format_documents(docs, first_number=4)
    assert block == "Document [4](Title: Paris): Paris is in France.\nDocument [5]: Untitled text.\n"
    p = t.refine_prompt("Where?", block, ["Paris is big [1]."], "old")
    assert "- Paris is big [1]." in p and "Document [4]" in p and "Question: Where?" in p
    assert "(none)" in t.refine_prompt("Where?", block, [], "old")
    with pytest.raises(ValueError, match=re.escape(
            "prompt template 'answer' uses unknown field(s) ['question']; available fields: ['documents', 'query']")):
        PromptTemplates(answer="{question} {documents}")
    with pytest.raises(ValueError, match=re.escape("prompt template 'verifier' is not a valid str.format template")):
        PromptTemplates(verifier="{query")
    custom = PromptTemplates(answer="Q={query}\n{documents}")
    assert custom.answer_prompt("x", "D") == "Q=x\nD"


def test_documents_validation_messages() -> None:
    assert as_documents(["a", {"title": "T", "text": "b"}], "documents[0]") == [Document("a"), Document("b", "T")]
    with pytest.raises(TypeError, match=re.escape(
            "documents[0][1] must be a string or a {'title': ..., 'text': ...} dict; got int")):
        as_documents(["a", 3], "documents[0]")
    with pytest.raises(ValueError, match=re.escape(
            "documents[2][0] is a mapping without a 'text' field (keys: ['body']); give a string or "
            "{'title': ..., 'text': ...}")):
        as_documents([{"body": "x"}], "documents[2]")
    with pytest.raises(ValueError, match=re.escape(
            "documents[1] is empty; give at least one document (or a retriever)")):
        as_documents([], "documents[1]")
    with pytest.raises(TypeError, match=re.escape("documents[0] must be a list of documents")):
        as_documents("just a string", "documents[0]")
    with pytest.raises(TypeError, match=re.escape("documents[0][0]['title'] must be str; got int")):
        as_documents([{"title": 5, "text": "x"}], "documents[0]")


def test_premise_and_truncation_estimate() -> None:
    assert premise_text([Document("b", "T"), Document("c")]) == "Title: T\nb\nc"
    assert estimate_tokens("") == 0
    assert estimate_tokens("one two three") == 4  # ceil(1.3 * 3)
    assert not pair_overflows("short premise", "short hypothesis")
    assert pair_overflows("word " * 400, "hypothesis", max_length=512)


def test_rouge_l_hand_computed() -> None:
    # LCS("the cat sat on the mat", "the cat is on the mat") = the cat on the mat = 5; P = R = 5/6.
    assert rouge_l("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(5 / 6)
    assert rouge_l("", "x") == 0.0
    assert rouge_l("a b", "c d") == 0.0
    assert rouge_l("a b c", "a b c") == pytest.approx(1.0)
