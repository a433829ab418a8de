"""training.grpo on a micro model (32 px, 4 scales): PANW, advantages, the clipped loss and KL, old == new at
the first update, batched == looped rollouts, merge control, logging, RUN/final, exact resume after kill -9,
rewards, input errors."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_tools.synth import SynthConfig, generate
from stylevar.models.lora import LoRAConfig, attach_lora, lora_modules, lora_parameters, snapshot_lora
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import micro_configs, run_recipe, single_thread_env
from tests.models.test_lora import lively
from training.grpo import __main__ as grpo
from training.grpo import objective as grpo_objective
from training.grpo import trainer as grpo_trainer
from training.parts.data import collate_triplets, open_triplets
from training.grpo.merge_control import MergeConfig, MergeController
from training.parts.optim import make_adamw
from training.parts.checkpoints import CheckpointManager
from training.parts.distributed import DistEnv
from training.parts.log import read_log
from training.parts.scale_weights import panw_weights
from training.grpo.rewards import Reward, RewardConfig

REPO = Path(__file__).resolve().parents[2]
PY = Path(sys.executable)  # the environment the tests run in
PAPER_TABLE = (0.0337, 0.0128, 0.0072, 0.0048, 0.0035, 0.0027, 0.0018, 0.0013, 0.0009, 0.0007)


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


_env = single_thread_env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    pipe = StylePipeline.random(micro_configs(), seed=0)
    lively(pipe.model)
    model_dir = pipe.save_pretrained(root / "model")
    manifest = generate(SynthConfig(out=str(root / "data"), count=16, size=32, seed=2, val_fraction=0.0))
    return {"root": root, "model": model_dir, "manifest": manifest}


def _batch(setup, n: int = 2):
    ds = open_triplets(setup["manifest"], "train", 32, None)
    b = collate_triplets([ds[i] for i in range(n)])
    return {k: b[k] for k in ("content", "style", "target")}


def _trainer(setup, cfg: grpo_trainer.GRPOConfig, merge: MergeConfig | None = None, lr: float = 1e-2):
    model = StylePipeline.from_pretrained(setup["model"], device="cpu").model
    attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    model.eval()
    opt = make_adamw(model, lr, 0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    reward = Reward(RewardConfig("ssim", 5.0, image_size=32))
    return grpo_trainer.GRPOTrainer(model, reward, cfg, merge or MergeConfig(), opt, sched, env)


# ------------------------------------------------------------------------------------------ math
def test_panw_weights_match_the_paper_table_and_sum_to_one():
    pns = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
    w = panw_weights(pns, 0.7)
    assert w.shape == (sum(p * p for p in pns),) == (680,)
    per_scale = [float(x[0]) for x in w.split([p * p for p in pns])]
    assert [round(x, 4) for x in per_scale] == list(PAPER_TABLE)
    assert float(w.double().sum()) == pytest.approx(1.0, abs=1e-6)
    for x, p in zip(w.split([p * p for p in pns]), pns):  # constant within a scale
        assert torch.all(x == x[0])
    tiny = panw_weights((1, 2, 3, 4, 6, 8), 0.7)
    assert float(tiny.double().sum()) == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(panw_weights(pns, 0.0), torch.full((680,), 1 / 680))  # gamma 0: plain mean


def test_group_advantages():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    a = grpo_objective.group_advantages(r, eps=1e-4)
    std = torch.tensor([1.0, 2.0, 3.0, 4.0]).std()
    torch.testing.assert_close(a[0], (r[0] - 2.5) / (std + 1e-4))
    assert torch.equal(a[1], torch.zeros(4))  # a group with equal rewards teaches nothing
    with pytest.raises(ValueError):
        grpo_objective.group_advantages(torch.ones(3, 1))


def test_clipped_policy_loss_and_k3_by_hand():
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    old = torch.zeros(1, 4)
    pg, rho = grpo_objective.clipped_policy_loss(new, old, torch.tensor([1.0]), 0.2)
    torch.testing.assert_close(rho, torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    torch.testing.assert_close(pg, torch.tensor([[-1.2, -0.5, -1.1, -0.7]]))  # A > 0: gains capped at 1 + eps
    pg, _ = grpo_objective.clipped_policy_loss(new, old, torch.tensor([-1.0]), 0.2)
    torch.testing.assert_close(pg, torch.tensor([[1.5, 0.8, 1.1, 0.8]]))  # A < 0: the pessimistic side
    ref, pol = torch.tensor([0.3, -0.2, 0.0]), torch.tensor([0.1, 0.4, 0.0])
    d = ref - pol
    torch.testing.assert_close(grpo_objective.k3_kl(ref, pol), torch.exp(d) - 1 - d)
    assert float(grpo_objective.k3_kl(torch.tensor([0.0]), torch.tensor([1e-4]))) > 0  # no cancellation to 0 in fp32


def test_grpo_loss_by_hand():
    """The loss of two rollouts of two tokens, term by term; its parts and gradients."""
    rho = [[1.5, 0.5], [1.1, 0.7]]  # old = 0, so rho = exp(new)
    ref = [[0.1, -0.2], [0.3, 0.0]]
    adv, w, eps, beta = [1.0, -2.0], [0.25, 0.75], 0.2, 0.5
    new = torch.log(torch.tensor(rho, dtype=torch.float64)).requires_grad_()
    loss, parts = grpo_objective.grpo_loss(new, torch.zeros(2, 2, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
                                 torch.tensor(adv, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                                 clip_eps=eps, kl_beta=beta)
    expected, grads = 0.0, [[0.0, 0.0], [0.0, 0.0]]
    for i in range(2):
        for t in range(2):
            r, a, d = rho[i][t], adv[i], ref[i][t] - math.log(rho[i][t])
            clipped = min(max(r, 1 - eps), 1 + eps)
            policy = -min(r * a, clipped * a)
            k3 = math.exp(d) - 1 - d
            expected += w[t] * (policy + beta * k3) / 2  # mean over the 2 rollouts
            d_policy = -a * r if r * a <= clipped * a else 0.0  # the clipped side has no gradient
            grads[i][t] = w[t] * (d_policy + beta * (1 - math.exp(d))) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    assert parts == {"clipped": 3.0, "ratio_dev": pytest.approx(0.5)}  # |rho - 1| > 0.2: 1.5, 0.5, 0.7
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor(grads, dtype=torch.float64))
    # a chunk of a larger step is divided by the step's row count
    half, _ = grpo_objective.grpo_loss(new, torch.zeros(2, 2, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
                             torch.tensor(adv, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                             clip_eps=eps, kl_beta=beta, num_rows=4)
    assert float(half.detach()) == pytest.approx(expected / 2, rel=1e-12)


def test_rollout_seeds_are_derived_and_rank_independent():
    a = [grpo_trainer.rollout_seed(0, 3, i) for i in range(8)]
    assert a == [grpo_trainer.rollout_seed(0, 3, i) for i in range(8)] and len(set(a)) == 8
    assert a != [grpo_trainer.rollout_seed(0, 4, i) for i in range(8)] and a != [grpo_trainer.rollout_seed(1, 3, i) for i in range(8)]
    one = grpo_trainer.rollout_indices(4, 3)
    assert one == list(range(12))
    two = sorted(grpo_trainer.rollout_indices(2, 3, 0, 2) + grpo_trainer.rollout_indices(2, 3, 1, 2))
    assert two == one


# ------------------------------------------------------------------------------------------ the step
def test_step_zero_old_equals_new_and_every_ratio_is_one(setup):
    t = _trainer(setup, grpo_trainer.GRPOConfig(group_size=3, top_k=0, top_p=0.0))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # a policy that differs from the reference, so `ref` differs from `old`
        for p in lora_parameters(t.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    r = t.rollout(_batch(setup), step=1)
    t.reference_logprobs(r)
    with grpo_objective.fp32_policy(t.model):
        logits = t.model.teacher_forcing_logits(r.content, r.style, r.tokens, cond=r.cond)
    new = grpo_objective.token_logprobs(logits, torch.cat(r.tokens, 1))
    assert new.requires_grad
    assert torch.equal(new.detach(), r.old)
    _, ratio = grpo_objective.clipped_policy_loss(new, r.old, r.advantages, 0.2)
    assert torch.equal(ratio, torch.ones_like(ratio))
    assert (r.ref - r.old).abs().max() > 1e-4  # LoRA on vs off really differ
    stats = t.step(_batch(setup), step=1)  # the same through the full step, chunked teacher forcing too
    assert stats["ratio_dev"] == 0.0 and stats["clip_frac"] == 0.0 and stats["skipped"] == 0
    t2 = _trainer(setup, grpo_trainer.GRPOConfig(group_size=3, tf_chunk=2, rollout_chunk=4))
    assert t2.step(_batch(setup), step=1)["ratio_dev"] == 0.0


def test_loss_and_gradients_follow_the_formula(setup):
    """policy_pass == the loss written out; a second PPO epoch sees ratios != 1 (old stays fixed)."""
    cfg = grpo_trainer.GRPOConfig(group_size=3, kl_beta=0.3, tf_chunk=4, ppo_epochs=2)
    t = _trainer(setup, cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in lora_parameters(t.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    r = t.rollout(_batch(setup), step=2)
    t.reference_logprobs(r)
    r.old = r.old + 0.01 * torch.randn(r.old.shape, generator=g)  # an off-policy `old`: ratios != 1
    d = t.policy_pass(r, want_entropy=True)
    grads = [p.grad.clone() for p in t.params]
    t.optimizer.zero_grad(set_to_none=True)
    with grpo_objective.fp32_policy(t.model):
        logits = t.model.teacher_forcing_logits(r.content, r.style, r.tokens)
    new = grpo_objective.token_logprobs(logits, torch.cat(r.tokens, 1))
    rho = torch.exp(new - r.old)
    a = r.advantages[:, None]
    pol = -torch.minimum(rho * a, rho.clamp(0.8, 1.2) * a)
    kl = torch.exp(r.ref - new) - 1 - (r.ref - new)
    w = panw_weights(t.model.cfg.patch_nums, 0.7)
    loss = (w * (pol + 0.3 * kl)).sum(1).mean()
    loss.backward()
    assert d["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    for p, gr in zip(t.params, grads):
        torch.testing.assert_close(gr, p.grad, atol=1e-7, rtol=1e-4)
    assert d["ratio_dev"] > 0 and set(f"entropy_s{k}" for k in range(4)) <= set(d)
    assert all(0 < d[f"entropy_s{k}"] <= math.log(64) + 1e-5 for k in range(4))

    t = _trainer(setup, cfg)
    stats = t.step(_batch(setup), step=1)
    assert stats["ratio_dev"] == 0.0  # the first of the two epochs is on-policy ...
    assert stats["clip_frac"] > 0.0  # ... the second is not (lr 1e-2 moves the policy past the clip range)


def test_batched_rollouts_equal_a_loop_of_single_generates(setup):
    batch = _batch(setup)
    a = _trainer(setup, grpo_trainer.GRPOConfig(group_size=4)).rollout(batch, step=3)
    b = _trainer(setup, grpo_trainer.GRPOConfig(group_size=4, batched_rollouts=False)).rollout(batch, step=3)
    c = _trainer(setup, grpo_trainer.GRPOConfig(group_size=4, rollout_chunk=3)).rollout(batch, step=3)
    for x, y, z in zip(a.tokens, b.tokens, c.tokens):
        assert torch.equal(x, y) and torch.equal(x, z)
    torch.testing.assert_close(a.images, b.images, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.rewards, b.rewards, atol=1e-5, rtol=0)
    d = _trainer(setup, grpo_trainer.GRPOConfig(group_size=4)).rollout(batch, step=4)
    assert any(not torch.equal(x, y) for x, y in zip(a.tokens, d.tokens))  # another step, other samples
    assert a.content.shape[0] == 8 and torch.equal(a.content[0], a.content[3])  # triplet-major rows
    assert torch.allclose(a.advantages.view(2, 4).sum(1), torch.zeros(2), atol=1e-4)


def test_merge_controller_schedule():
    c = MergeController(MergeConfig(ema_decay=0.0, min_gain=0.05, patience=3, cooldown=5,
                                              emergency_kl=2.0, emergency_cooldown=4, skip_kl=5.0))
    snaps = iter(range(100))
    due = []
    rewards = [0.0, 0.1, 0.1, 0.1, 0.2, 0.3, 0.26, 0.1, 0.2, 0.4, 0.4, 0.4]
    for step, r in enumerate(rewards, start=1):
        c.observe(step, r, lambda: {"id": torch.tensor(next(snaps))})
        if c.merge_due(step):
            due.append((step, float(c.peak), int(c.snapshot["id"])))
            c.merged(step, False, {"id": torch.tensor(-1)})
    # EMA = reward (decay 0), baseline 0.0. Gain >= 0.05 from step 2, patience 3 reached at step 4, cooldown 5
    # at step 5: merge of the peak so far (0.2, the 3rd snapshot). Baseline 0.2 -> gains >= 0.25 at steps 6, 7,
    # broken at 8; again at 10, 11, 12 -> merge at 12 of the peak 0.4 (snapshot taken at step 10).
    assert due == [(5, 0.2, 2), (12, 0.4, 4)]
    assert c.merges == 2 and c.baseline == pytest.approx(0.4)
    assert c.emergency_due(13, 2.5) and not c.emergency_due(13, 1.5)
    c.merged(13, True, {})
    assert not c.emergency_due(15, 3.0) and c.emergency_due(17, 3.0)
    assert c.skip_due(5.1) and not c.skip_due(4.9) and c.skip_due(float("nan"))
    state = c.state_dict()
    d = MergeController(c.cfg)
    d.load_state_dict(state)
    assert d.state_dict() == state
    off = MergeController(MergeConfig(enabled=False, patience=1, cooldown=0))
    off.observe(1, 0.0, dict)
    off.observe(2, 1.0, dict)
    assert not off.merge_due(2) and not off.emergency_due(2, 10.0)


def test_merge_bakes_the_peak_snapshot(setup):
    t = _trainer(setup, grpo_trainer.GRPOConfig(group_size=3))
    g = torch.Generator().manual_seed(6)
    batch = _batch(setup)
    r = t.rollout(batch, step=1)

    def logits():
        with torch.no_grad():
            return t.model.teacher_forcing_logits(r.content, r.style, r.tokens)

    with torch.no_grad():
        for p in lora_parameters(t.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peak_logits = logits()
    t.controller.observe(1, 1.0, lambda: snapshot_lora(t.model))
    t.step(batch, step=2)  # moves LoRA away from the peak and creates optimizer state
    assert t.optimizer.state
    assert (logits() - peak_logits).abs().max() > 1e-5
    t._merge(2, emergency=False)
    torch.testing.assert_close(logits(), peak_logits, atol=1e-5, rtol=0)
    assert all(torch.count_nonzero(m.lora_B) == 0 for m in lora_modules(t.model).values())
    assert not t.optimizer.state and t.controller.merges == 1


def test_high_kl_skips_or_merges(setup):
    t = _trainer(setup, grpo_trainer.GRPOConfig(group_size=3), MergeConfig(emergency_kl=1e-9, emergency_cooldown=10,
                                                                        skip_kl=1e-9))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in lora_parameters(t.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    before = snapshot_lora(t.model)
    s1 = t.step(_batch(setup), step=1)
    assert s1["kl"] > 1e-9 and s1["emergency"] == 1 and s1["merged"] == 1 and s1["skipped"] == 1
    # the peak snapshot (taken at step 1, before any update) was baked: LoRA restarted at zero
    assert all(torch.count_nonzero(m.lora_B) == 0 for m in lora_modules(t.model).values())
    with torch.no_grad():
        for p in lora_parameters(t.model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    s2 = t.step(_batch(setup), step=2)  # emergency cooling down: the step is skipped, nothing changes
    assert s2["skipped"] == 1 and s2["emergency"] == 0 and "loss" not in s2
    assert before.keys() == snapshot_lora(t.model).keys()


# ------------------------------------------------------------------------------------------ the recipe
def _args(setup, out, steps, *extra) -> list[str]:
    return ["--data", str(setup["manifest"]), "--init", str(setup["model"]), "--out", str(out),
            "--reward", "ssim", "--reward-image-size", "32", "--group-size", "3", "--batch-size", "2",
            "--max-steps", str(steps), "--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2", "--no-progress",
            *map(str, extra)]


def test_run_logs_and_writes_a_merged_model_dir(setup, tmp_path, capsys):
    out = tmp_path / "run"
    assert grpo.main(_args(setup, out, 4, "--save-every", 2, "--merge-patience", 1, "--merge-cooldown", 3,
                           "--merge-min-gain", -10)) == 0
    log = read_log(out)
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    for r in log:
        assert {"step", "reward_mean", "reward_std", "kl", "loss", "clip_frac", "merged", "entropy_s0",
                "entropy_s3", "reward_ema", "lr"} <= set(r), sorted(r)
    assert [r["merged"] for r in log] == [0, 0, 1, 0]
    assert log[0]["kl"] == 0.0 and log[1]["kl"] > 0  # LoRA starts at zero, then moves away from the reference
    tb = list((out / "tb").glob("events.out.tfevents.*"))
    assert tb
    final = StylePipeline.from_pretrained(out / "final", device="cpu")
    assert final.config.name == "stylevar-grpo" and final.config.extra["recipe"] == "grpo"
    assert not any(".lora_" in k for k in final.model.transformer_state_dict())
    # `stylevar merge-lora RUN` on the last checkpoint gives the same model
    from stylevar.cli import main as cli_main

    assert cli_main(["merge-lora", str(out), "--out", str(tmp_path / "merged")]) == 0
    merged = StylePipeline.from_pretrained(tmp_path / "merged", device="cpu")
    a, b = final.model.transformer_state_dict(), merged.model.transformer_state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    base = StylePipeline.from_pretrained(setup["model"], device="cpu").model.transformer_state_dict()
    assert any(not torch.equal(a[k], base[k]) for k in a)  # training changed the weights
    for k in a:
        if ".attn." not in k and ".ffn." not in k:
            assert torch.equal(a[k], base[k]), k  # only the adapted linears change


def test_time_based_checkpoints(setup, tmp_path, capsys):
    # an interval far shorter than a step: every step is past it, so every step writes a checkpoint
    out = tmp_path / "timed"
    assert grpo.main(_args(setup, out, 3, "--save-every", 100, "--save-every-minutes", 1e-9,
                           "--keep-checkpoints", 10)) == 0
    assert [s for s, _ in CheckpointManager(out / "checkpoints", DistEnv(0, 1, 0, torch.device("cpu"))
                                                 ).paths()] == [1, 2, 3]
    err = capsys.readouterr().err
    assert "checkpoint step-00000002.pt; step 2/3 (66%)" in err and "left (ends about" in err
    # by steps only: the last step
    out = tmp_path / "steps"
    assert grpo.main(_args(setup, out, 3, "--save-every", 100, "--save-every-minutes", 0)) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000003.pt"]


def test_runs_on_webdataset_shards(setup, tmp_path, capsys):
    from data_tools.shards import ShardConfig, write_shards

    shards = tmp_path / "shards"
    write_shards(ShardConfig(str(setup["manifest"]), str(shards), shard_size=8, workers=1))
    args = _args(setup, tmp_path / "run", 2)
    args[args.index("--data") + 1] = str(shards)
    assert grpo.main(args) == 0
    assert "16 training triplets" in capsys.readouterr().err
    assert [r["step"] for r in read_log(tmp_path / "run")] == [1, 2]


def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one(setup, tmp_path, capsys):
    from safetensors.torch import load_file

    out, args = tmp_path / "run", _args(setup, tmp_path / "run", 4, "--save-every", 2)
    assert grpo.main(args) == 0  # checkpoints at steps 2 and 4
    done = load_file(str(out / "final" / "transformer.safetensors"))
    newest = out / "checkpoints" / "step-00000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a torn write
    capsys.readouterr()
    assert grpo.main(args) == 0
    err = capsys.readouterr().err
    assert "resumed from step 2" in err and f"checkpoint {newest} is unreadable (" in err
    assert [r["step"] for r in read_log(out)] == [1, 2, 3, 4]
    again = load_file(str(out / "final" / "transformer.safetensors"))
    assert all(torch.equal(done[k], again[k]) for k in done)  # steps 3 and 4 trained again, identically

    for p in (out / "checkpoints").glob("step-*.pt"):
        p.write_bytes(b"")
    with pytest.raises(SystemExit, match=r"^error: no readable checkpoint in .*: step-00000004.pt \(empty file\); "
                                         r"step-00000002.pt \(empty file\)\. "):
        grpo.main(args)


@pytest.mark.slow
def test_resume_after_kill_9_continues_exactly(setup, tmp_path):
    steps, half = 10, 5
    common = ("--save-every", half, "--merge-patience", 1, "--merge-cooldown", 3, "--merge-min-gain", -10)
    run_recipe("training.grpo", _args(setup, tmp_path / "full", steps, *common), tmp_path / "full")
    run_recipe("training.grpo", _args(setup, tmp_path / "killed", steps, *common), tmp_path / "killed",
               kill_at_step=half)
    cmd = [str(PY), "-m", "training.grpo", *_args(setup, tmp_path / "killed", steps, *common)]
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "full" / "final" / "transformer.safetensors"))
    b = load_file(str(tmp_path / "killed" / "final" / "transformer.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    volatile = ("time", "t_rollout", "t_reward", "t_policy")
    strip = lambda log: [{k: v for k, v in r.items() if k not in volatile} for r in log]  # noqa: E731
    la, lb = strip(read_log(tmp_path / "full")), strip(read_log(tmp_path / "killed"))
    assert la == lb
    assert sum(r["merged"] for r in la[half:]) >= 1  # the resumed half merged (merge state was restored)

    bad = subprocess.run([*cmd, "--kl-beta", "0.5"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "different configuration" in bad.stderr and "kl_beta" in bad.stderr


@pytest.mark.slow
def test_torchrun_two_processes_match_one(setup, tmp_path):
    """Rollout seeds follow the global position of a triplet, stats and gradients are reduced over ranks."""
    common = ("--batch-size", 4)
    single = subprocess.run([str(PY), "-m", "training.grpo", *_args(setup, tmp_path / "one", 2, *common)],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    torchrun = PY.with_name("torchrun")
    two = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "training.grpo",
                          *_args(setup, tmp_path / "two", 2, *common)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world size 2" in two.stderr
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "one" / "final" / "transformer.safetensors"))
    b = load_file(str(tmp_path / "two" / "final" / "transformer.safetensors"))
    # lr 1e-2: a missing or wrong reduction moves weights by ~1e-3; summing the same gradients in another
    # order moves a few Adam-normalised elements by ~3e-6 (seen after the synthetic target rule changed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-5, msg=k)
    for ra, rb in zip(read_log(tmp_path / "one"), read_log(tmp_path / "two")):
        for key in ("reward_mean", "reward_std", "kl", "loss", "clip_frac", "entropy_s2", "merged"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-7), (ra["step"], key)


def test_input_errors(setup, tmp_path):
    with pytest.raises(SystemExit, match="not a model directory"):
        grpo.main(_args(setup, tmp_path / "r", 1)[:2] + ["--init", str(tmp_path)] + _args(setup, tmp_path / "r", 1)[4:])
    with pytest.raises(SystemExit, match="grad-accum"):
        grpo.main(_args(setup, tmp_path / "r", 1, "--grad-accum", 2))
    with pytest.raises(SystemExit, match="group-size"):
        grpo.main(_args(setup, tmp_path / "r", 1, "--group-size", 1))
    with pytest.raises(SystemExit, match="not found"):
        grpo.main(["--data", str(tmp_path / "nope.jsonl")] + _args(setup, tmp_path / "r", 1)[2:])


# ------------------------------------------------------------------------------------------ rewards
def test_ssim_and_l1_rewards():
    g = torch.Generator().manual_seed(0)
    target = torch.rand(3, 3, 32, 32, generator=g)
    noisy = (target + 0.2 * torch.randn(3, 3, 32, 32, generator=g)).clamp(0, 1)
    far = torch.rand(3, 3, 32, 32, generator=g)
    for name in ("ssim", "l1"):
        rew = Reward(RewardConfig(name, scale=5.0, image_size=32))
        same = rew(target, target, target, target)
        assert torch.allclose(same, torch.zeros(3), atol=1e-5), name
        r_noisy, r_far = rew(noisy, target, target, target), rew(far, target, target, target)
        assert torch.all(r_noisy < 0) and torch.all(r_far < r_noisy), name
    from stylevar.metrics.structure import ssim

    r = Reward(RewardConfig("ssim", scale=2.0, image_size=32))(noisy, target, target, target)
    torch.testing.assert_close(r, -2.0 * (1 - ssim(noisy, target)))
    r = Reward(RewardConfig("l1", scale=3.0))(noisy, target, target, target)
    torch.testing.assert_close(r, -3.0 * (noisy - target).abs().mean((1, 2, 3)))
    with pytest.raises(ValueError, match="unknown reward"):
        RewardConfig("psnr")


def test_style_term_of_the_reward():
    from stylevar.metrics.style_fidelity import colour_swd

    g = torch.Generator().manual_seed(1)
    target, style = torch.rand(2, 3, 32, 32, generator=g), torch.rand(2, 3, 32, 32, generator=g) * 0.5
    gen = (target + 0.1 * torch.randn(2, 3, 32, 32, generator=g)).clamp(0, 1)
    plain = Reward(RewardConfig("l1", scale=2.0))(gen, target, style, target)
    styled = Reward(RewardConfig("l1", scale=2.0, style_weight=0.5))(gen, target, style, target)
    torch.testing.assert_close(styled, plain - 2.0 * 0.5 * colour_swd(gen, style))
    # the style term is measured against the style: 0 for the style's own colours, > 0 for the target's
    rew = Reward(RewardConfig("l1", scale=1.0, style_weight=1.0))
    torch.testing.assert_close(rew.distance(style, target, style, target), rew.target_distance(style, target, style, target))
    assert torch.all(rew.distance(target, target, style, target) > 0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="style weight"):
            RewardConfig("l1", style_weight=bad)


def test_weighted_rewards_fail_early_without_weights(weight_homes):
    from stylevar.loaders.weights import MissingWeightError

    for name in ("dreamsim", "lpips", "clip"):
        with pytest.raises(MissingWeightError):
            Reward(RewardConfig(name))
