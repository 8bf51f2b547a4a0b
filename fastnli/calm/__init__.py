"""CaLM: verify grounded answers of a large LM against what a small LM derives from the cited documents alone.

``calm_batch`` runs the loop for many queries at once (LM calls concurrent and bounded, one NLI engine pass per
iteration); ``grounding`` gives the (statement × source) NLI matrix, SummaC-ZS and the max-over-sources score;
``alce_citations`` evaluates ALCE citation recall/precision of any answers; ``OpenAIChatLM`` talks to any
OpenAI-compatible chat-completions server.
"""

from fastnli.calm.alce import AlceResult, alce_citations
from fastnli.calm.checks import AnswerCheck, AnswerInput, CheckConfig, StatementCheck, check_answers, rouge_l
from fastnli.calm.documents import Document
from fastnli.calm.grounding import GroundingResult, grounding
from fastnli.calm.lm import BatchedLM, LangChainLM, LMError, OpenAIChatLM, batched
from fastnli.calm.loop import Retriever, calm, calm_batch
from fastnli.calm.prompts import PromptTemplates
from fastnli.calm.result import CalmBatchResult, CalmResult, IterationTrace
from fastnli.calm.statements import Statement, parse_citations, split_statements, strip_citations

__all__ = [
    "AlceResult", "AnswerCheck", "AnswerInput", "BatchedLM", "CalmBatchResult", "CalmResult", "CheckConfig",
    "Document", "GroundingResult", "IterationTrace", "LMError", "LangChainLM", "OpenAIChatLM", "PromptTemplates", "Retriever",
    "Statement", "StatementCheck", "alce_citations", "batched", "calm", "calm_batch", "check_answers", "grounding",
    "parse_citations", "rouge_l", "split_statements", "strip_citations",
]
