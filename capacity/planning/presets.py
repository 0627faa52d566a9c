"""The planner's workload presets (``plan_mix --workload``, ``bench economics``): request-size histograms in buckets
of (prompt tokens, output tokens, requests per second), from the shapes docs/algorithms.md describes ("Routing a mixed fleet"): short chat with
the occasional pasted document, long documents, and a mix of the two."""

from capacity.planning.mix import Bucket

WORKLOADS = {
    "short_chat": [
        Bucket("chat-128", 128, 64, 40.0),
        Bucket("chat-512", 512, 128, 40.0),
        Bucket("chat-1k", 1024, 256, 20.0),
        Bucket("paste-6k", 6144, 256, 2.0),
    ],
    "long_docs": [
        Bucket("doc-2k", 2048, 256, 3.0),
        Bucket("doc-4k", 4096, 256, 6.0),
        Bucket("doc-7k", 7168, 512, 3.0),
    ],
    "mixed": [
        Bucket("chat-128", 128, 64, 30.0),
        Bucket("chat-512", 512, 128, 30.0),
        Bucket("chat-1k", 1024, 256, 10.0),
        Bucket("doc-4k", 4096, 256, 4.0),
        Bucket("doc-7k", 7168, 512, 2.0),
    ],
}
