"""`stylevar evaluate`: methods side by side on benchmark triplets, the StyleVAR paper's Table 1 metrics.

For each benchmark (a triplet manifest, see docs/architecture.md) `n` rows are drawn with the seed; every
method stylises the same 256 x 256 content/style pairs; the metrics of `stylevar.metrics` are computed
(paired benchmarks compare to the target, unpaired ones to the content) with the seconds per image of
each method's own inference (CUDA synchronised, after one untimed warm-up call).

Methods: model directories or hub ids, `adain`, `adain-paper`, `reinhard` and `magenta` (`methods`). Writes
`results.csv`, `results.md`, `per_sample.jsonl`, sample grids and one chart per metric (`report`, `charts`).
Missing weights stop the run before any work unless `--allow-missing`, which marks what they would give `missing`.
"""
