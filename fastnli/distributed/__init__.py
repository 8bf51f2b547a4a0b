"""Scale-out on Ray: score datasets larger than one machine with fastnli engines on a Ray cluster.

``pip install 'fastnli[ray]'``. :func:`score_dataset` maps :class:`NLIScorer` (one engine per actor) over a Ray
dataset; the artifact is exported once on the driver and reaches actors by path or through the object store.

    import ray
    from fastnli.distributed import score_dataset

    ray.init(address="auto")
    scored = score_dataset("s3://bucket/samples/", "microsoft/deberta-large-mnli", num_actors=8,
                           num_gpus_per_actor=1, scorers=["noncontradiction", "semantic_negentropy"])
    scored.write_parquet("s3://bucket/scores/")
"""

from fastnli.distributed.actor import NLIScorer, output_columns
from fastnli.distributed.artifact import SharedArtifact, share_artifact
from fastnli.distributed.dataset import read_dataset, score_dataset, write_scores

__all__ = ["NLIScorer", "SharedArtifact", "output_columns", "read_dataset", "score_dataset", "share_artifact",
           "write_scores"]
