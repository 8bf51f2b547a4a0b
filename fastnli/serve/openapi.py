"""The hand-written OpenAPI 3.1 document served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from fastnli.serve.config import ServeConfig

__all__ = ["openapi_document"]

_PAIR = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2,
         "description": "[premise, hypothesis]"}
_ERROR = {"type": "object", "required": ["error", "error_type"],
          "properties": {"error": {"type": "string"}, "error_type": {
              "type": "string", "enum": ["Validation", "Overloaded", "Unhealthy", "Timeout", "Backend", "NotFound"]}}}
_PROBS = {"type": "object", "properties": {k: {"type": "number"} for k in ("contradiction", "neutral", "entailment")}}
_NCP_IN = {"type": "object", "required": ["response", "sampled_responses"], "properties": {
    "response": {"type": "string"},
    "sampled_responses": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "scorers": {"type": "array", "items": {"type": "string", "enum": ["noncontradiction", "entailment",
                                                                         "semantic_negentropy",
                                                                         "semantic_sets_confidence"]},
                "default": ["noncontradiction"]},
    "use_best": {"type": "boolean", "default": False},
    "prompt": {"type": "string", "description": "the question the responses answer (question-aware scoring)"},
    "question_aware": {"type": ["boolean", "null"], "default": None,
                       "description": "null: use the prompt where the model was trained question-aware"},
    "align_units": {"type": ["boolean", "null"], "default": None,
                    "description": "rewrite quantities in the other answer's units (and equal numbers in its form: "
                                   "digits or words) before NLI; null: the model's "
                                   "default (on for the embedded model)"}}}
_NCP_OUT = {"type": "object", "properties": {
    "num_samples": {"type": "integer"}, "noncontradiction": {"type": ["number", "null"]},
    "entailment": {"type": ["number", "null"]}, "semantic_negentropy": {"type": ["number", "null"]},
    "semantic_sets_confidence": {"type": ["number", "null"]}, "num_semantic_sets": {"type": ["integer", "null"]},
    "best_response": {"type": ["string", "null"]}, "scorers": {"type": "array", "items": {"type": "string"}}}}
_DOC = {"oneOf": [{"type": "string"}, {"type": "object", "required": ["text"], "properties": {
    "title": {"type": "string"}, "text": {"type": "string"}}}]}
_CALM_IN = {"type": "object", "required": ["answer"], "properties": {
    "answer": {"type": "string", "description": "answer with ALCE citations; [n] cites documents[n-1]"},
    "documents": {"type": "array", "items": _DOC, "default": []},
    "verifier_answer": {"type": ["string", "null"], "default": None},
    "config": {"type": "object", "description": "fastnli.calm.CheckConfig fields", "properties": {
        "entailment_rule": {"type": "string", "enum": ["threshold", "argmax"]},
        "entailment_threshold": {"type": "number"}, "window_entailment_threshold": {"type": ["number", "null"]},
        "contradiction_threshold": {"type": "number"},
        "accept_share": {"type": "number"}, "min_citation_recall": {"type": ["number", "null"]},
        "check_citations": {"type": "boolean"},
        "long_premise": {"type": "string", "enum": ["chunk", "truncate"], "default": "chunk"},
        "align_units": {"type": ["boolean", "null"], "default": None}}}}}
_GROUNDING_IN = {"type": "object", "required": ["documents"], "properties": {
    "statements": {"type": "array", "items": {"type": "string"}, "description": "the statements (or send answer)"},
    "answer": {"type": "string", "description": "a text split into statements (or send statements)"},
    "documents": {"type": "array", "items": _DOC, "minItems": 1},
    "granularity": {"type": "string", "enum": ["window", "sentence"], "default": "window"},
    "threshold": {"type": ["number", "null"], "default": None,
                  "description": "null: 0.5 for one source, the model's window threshold for several"},
    "matrix": {"type": "boolean", "default": True},
    "align_units": {"type": ["boolean", "null"], "default": None, "description": "null: the model's default"}}}
_PREDICTION = {"type": "array", "items": {"type": "object", "properties": {
    "label": {"type": "string"}, "score": {"type": "number"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {413: "a size limit was exceeded (body, pairs per request, characters per text, tokens)",
            422: "invalid request (the message names the field)", 429: "overloaded; retry after Retry-After seconds",
            500: "the engine failed", 503: "the model is loading or the service is shutting down",
            504: "no result within the request timeout"}
    return {str(c): {"description": text[c], "content": {"application/json": {"schema": _ERROR}}} for c in codes}


def _post(summary: str, body: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"post": {"summary": summary,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                     "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": result}}},
                                   **_errors(413, 422, 429, 500, 503, 504)}}}


def _get(summary: str, content_type: str = "application/json", codes: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK", "content": {content_type: {}}},
                                                      **_errors(*codes)}}}


def openapi_document(config: ServeConfig) -> dict[str, Any]:
    """The OpenAPI document, with the limits of ``config`` written into the descriptions."""
    from fastnli import __version__

    limits = (f"Limits: {config.max_pairs_per_request} NLI pairs per request, {config.max_text_chars} characters per "
              f"text, {config.max_body_bytes} bytes per body, {config.request_timeout_s:g} s per request.")
    return {
        "openapi": "3.1.0",
        "info": {"title": "fastnli", "version": __version__,
                 "description": "NLI probabilities, NCP consistency scores and CaLM checks over a dynamically "
                                "batched DeBERTa-MNLI engine. " + limits},
        "paths": {
            "/v1/nli": _post("NLI probabilities of (premise, hypothesis) pairs", {
                "type": "object", "required": ["pairs"],
                "properties": {"pairs": {"type": "array", "items": _PAIR}}}, {
                "type": "object", "properties": {
                    "results": {"type": "array", "items": {"type": "object", "properties": {
                        "label": {"type": "string"}, "probabilities": _PROBS}}},
                    "labels": {"type": "array", "items": {"type": "string"}}, "model": {"type": "string"},
                    "device": {"type": "string"}, "precision": {"type": "string"}}}),
            "/v1/ncp": _post("NCP (and other uqlm scorers) of responses against sampled responses",
                             {"oneOf": [_NCP_IN, {"type": "array", "items": _NCP_IN}]},
                             {"oneOf": [_NCP_OUT, {"type": "array", "items": _NCP_OUT}]}),
            "/v1/calm/check": _post("Statement corroboration and ALCE citation support of answers",
                                    {"oneOf": [_CALM_IN, {"type": "array", "items": _CALM_IN}]},
                                    {"description": "fastnli.calm.AnswerCheck as JSON (or an array of them)"}),
            "/v1/grounding": _post("The (statement x source) NLI matrix, SummaC-ZS and the max-over-sources score",
                                   _GROUNDING_IN, {"description": "fastnli.calm.GroundingResult as JSON"}),
            "/predict": _post("text-embeddings-inference sequence classification (raw_scores: log-probabilities)", {
                "type": "object", "required": ["inputs"], "properties": {
                    "inputs": {"oneOf": [_PAIR, {"type": "array", "items": _PAIR}]},
                    "raw_scores": {"type": "boolean", "default": False},
                    "truncate": {"type": "boolean", "default": False},
                    "truncation_direction": {"type": "string", "enum": ["Right"], "default": "Right"}}},
                {"oneOf": [_PREDICTION, {"type": "array", "items": _PREDICTION}]}),
            "/health": _get("liveness: 200 while the process serves HTTP"),
            "/ready": _get("readiness: 200 once the model is loaded, 503 while loading or shutting down",
                           codes=(503,)),
            "/info": _get("model, device, precision and limits", codes=(503,)),
            "/metrics": _get("Prometheus metrics", "text/plain"),
            "/openapi.json": _get("this document"),
        },
    }
