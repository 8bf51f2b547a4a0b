"""``NLIScorer``: the Ray Data ``map_batches`` callable that owns one NLI engine per actor.

Each actor loads the shared export artifact once (:class:`~fastnli.distributed.artifact.SharedArtifact`), then
scores every batch it gets with the same code as :func:`fastnli.score`: plan the directed pairs of the batch's
responses, one scheduled engine pass (the kernels dedup and pack them), read the scorers back. Batches are
``pyarrow.Table`` s; the output is the input table with one column per scorer appended, rows in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastnli.distributed.artifact import SharedArtifact
from fastnli.engine import BatchPolicy, NLIEngine, SessionConfig
from fastnli.engine.engine import DeviceArg, PrecisionArg
from fastnli.engine.labels import require_three_way
from fastnli.scorers.api import plan_scores, score_rows
from fastnli.scorers.questions import QUESTION_FORMAT
from fastnli.scorers.records import check_record

logger = logging.getLogger("fastnli")


#: the column that holds why a row could not be scored, when bad rows are kept (``on_invalid="keep"``)
ERROR_COLUMN = "error"


def output_columns(scorers: Sequence[str], use_best: bool, keep_invalid: bool = False) -> list[str]:
    """The columns :class:`NLIScorer` appends: one per scorer, ``best_response`` with ``use_best`` and a semantic
    scorer (as ``fastnli score`` writes them), and :data:`ERROR_COLUMN` when bad rows are kept."""
    semantic = {"semantic_negentropy", "semantic_sets_confidence"} & set(scorers)
    return [*scorers, *(["best_response"] if use_best and semantic else []),
            *([ERROR_COLUMN] if keep_invalid else [])]


class NLIScorer:
    """Scores batches of a Ray dataset; one instance (and one engine) per Ray actor.

    Args:
        artifact: the shared export artifact.
        device: the engine's device (``"cuda"`` for GPU actors, ``"cpu"`` otherwise; CUDA falls back to CPU).
        precision: the engine's precision (``"auto"``: FP16 on CUDA, the manifest's CPU choice otherwise).
        threads: the actor's CPU threads (its reserved CPUs; 0: all cores), divided among CPU streams for a small
            graph (:func:`fastnli.engine.session.cpu_streams`), so an actor never runs more threads than it has.
        scorers, use_best, max_length: as :func:`fastnli.score`.
        response_column, samples_column: the input columns (a string, and a list of strings).
        prompt_column, question_format: with a ``question_format`` (decided on the driver, as
            :func:`fastnli.scorers.questions.resolve_question_format`), each response is read as an answer to its
            row's ``prompt_column`` question; a batch without that column is scored on the answers alone unless
            ``require_prompts``.
        align_units: rewrite each pair's hypothesis quantities in its premise's units (decided on the driver, as
            :func:`fastnli.scorers.units.resolve_align_units`).
        id_column: a column whose value names a row in error messages (default: the row's place in its batch).
        batch_policy: the engine's batch policy (default: the device's).
        keep_invalid: a row that cannot be scored (a field missing or of the wrong type) gets its message in
            :data:`ERROR_COLUMN` and null scores, and the batch's other rows are scored (default False: it fails the
            batch, naming the row and the field).
    """

    def __init__(self, artifact: SharedArtifact, device: DeviceArg = "cpu", precision: PrecisionArg = "auto",
                 threads: int = 1, scorers: Sequence[str] = ("noncontradiction",), use_best: bool = False,
                 max_length: int | None = 2000, response_column: str = "response",
                 samples_column: str = "sampled_responses", id_column: str | None = None,
                 batch_policy: BatchPolicy | None = None, prompt_column: str = "prompt",
                 question_format: str | None = None, require_prompts: bool = False, align_units: bool = False,
                 keep_invalid: bool = False) -> None:
        self.engine = NLIEngine(artifact.open(), device=device, precision=precision, batch_policy=batch_policy,
                                session_config=SessionConfig(intra_op_threads=threads))
        require_three_way(self.engine.labels, f"scoring {list(scorers)} on Ray")
        self.scorers = tuple(scorers)
        self.use_best = use_best
        self.max_length = max_length
        self.response_column = response_column
        self.samples_column = samples_column
        self.id_column = id_column
        self.prompt_column = prompt_column
        self.question_format = question_format
        self.require_prompts = require_prompts
        self.align_units = align_units
        self.keep_invalid = keep_invalid
        self.columns = output_columns(self.scorers, use_best, keep_invalid)
        logger.info("Ray actor engine ready: %r", self.engine)

    def _where(self, table: Any, i: int, response: Any) -> str:
        if self.id_column is not None and self.id_column in table.column_names:
            return f"row {self.id_column}={table.column(self.id_column)[i].as_py()!r}"
        return f"row {i} of a batch (response {str(response)[:60]!r})"

    def __call__(self, table: Any) -> Any:
        import pyarrow as pa

        for name in (self.response_column, self.samples_column):
            if name not in table.column_names:
                raise ValueError(f"the dataset has no column {name!r} (columns: {table.column_names}); name the "
                                 "columns with response_column= / samples_column=")
        clash = [c for c in self.columns if c in table.column_names]
        if clash:
            raise ValueError(f"the dataset already has the output column(s) {clash}; rename or drop them first")
        responses = table.column(self.response_column).to_pylist()
        samples = table.column(self.samples_column).to_pylist()
        questions = None
        if self.question_format is not None and self.prompt_column in table.column_names:
            questions = table.column(self.prompt_column).to_pylist()
        elif self.require_prompts:
            raise ValueError(f"question_aware=True needs a {self.prompt_column!r} column (the question of each row); "
                             f"columns: {table.column_names}")
        errors = [self._check(table, i, responses[i], samples[i], questions) for i in range(len(responses))]
        ok = [i for i, e in enumerate(errors) if e is None]
        values: dict[str, list[Any]] = {name: [None] * len(responses) for name in self.columns}
        if ok:
            plan = plan_scores([responses[i] for i in ok], [samples[i] for i in ok], self.scorers,
                               use_best=self.use_best, max_length=self.max_length,
                               questions=None if questions is None else [questions[i] for i in ok],
                               question_format=self.question_format or QUESTION_FORMAT, align_units=self.align_units)
            probs, stats = self.engine.predict_with_stats(plan.pairs)
            for i, row in zip(ok, score_rows(plan, probs)):
                for name in self.columns:
                    if name != ERROR_COLUMN:
                        values[name][i] = getattr(row, name)
            logger.debug("batch of %d rows: %d pairs, %d unique, %.2f s", len(ok), stats.pairs_in,
                         stats.unique_pairs, stats.seconds)
        if self.keep_invalid:
            values[ERROR_COLUMN] = errors
        for name in self.columns:
            kind = pa.string() if name in ("best_response", ERROR_COLUMN) else pa.float64()
            table = table.append_column(name, pa.array(values[name], type=kind))
        return table

    def _check(self, table: Any, i: int, response: Any, samples: Any, questions: list[Any] | None) -> str | None:
        """Why row ``i`` cannot be scored, or None: a bad row raises ValueError unless bad rows are kept."""
        where = self._where(table, i, response)
        try:
            check_record({self.response_column: response, self.samples_column: samples}, where,
                         self.response_column, self.samples_column)
            if questions is not None and not isinstance(questions[i], str):
                raise ValueError(f"{where}: field {self.prompt_column!r} must be a string (the question), got "
                                 f"{type(questions[i]).__name__}")
        except ValueError as exc:
            if not self.keep_invalid:
                raise
            return str(exc)
        return None
