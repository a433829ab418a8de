"""`stylevar evaluate`: methods side by side on benchmark triplets, the StyleVAR paper's Table 1 metrics.

For each benchmark (a triplet manifest, see docs/architecture.md) `n` rows are drawn with the seed; every
method stylises the same 256 x 256 content/style pairs; the metrics of `stylevar.metrics` are computed
(paired benchmarks compare to the target, unpaired ones to the content) with the seconds per image of
each method's own inference (CUDA synchronised, after one untimed warm-up call).

Methods: a model directory (through `StylePipeline.from_pretrained`) or a hub id
`hf:OWNER/NAME[@REVISION][:grpo|sft]` (pulled on first use), `adain` (AdaIN with its own
`vgg_normalised.pth` encoder: the correct baseline), `adain-paper` (AdaIN on torchvision VGG-19 with
unnormalised input, as the StyleVAR paper's evaluation ran it: to reproduce Table 1), `reinhard` (Lab
colour transfer, no weights), `magenta` (Magenta's arbitrary stylization network, Ghiasi et al. 2017, on
onnxruntime: `pip install 'stylevar[teacher]'`).

Writes to OUT: `results.csv`, `results.md` (benchmark x method rows, arrows, best in bold),
`per_sample.jsonl`, `samples_<benchmark>.png` (content | style | target | each method) and
`chart_<metric>.png` (one bar chart per metric, time included).
Missing weights stop the run before any work (exit status 3) unless `--allow-missing`, which skips the
metrics (and methods) that need them and marks them `missing`.

Modules, bottom to top: `config` (EvalConfig, column names), `benchmarks` (manifests -> triplets),
`methods` (what is compared), `scoring` (timed batches -> per-sample scores), `ranks` (torchrun: each
process's batches, the merge), `runner` (`run`), `report` (tables) and `charts` (sample grids, bar
charts). `python -m stylevar.evaluate` is `stylevar evaluate` (stylevar.cli.evaluate).
"""
