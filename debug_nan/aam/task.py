"""The built-in task: the AAM-style pipeline (BIOM + tree or synthetic data -> batches -> AAMModel -> loss).

It is a task like any `--task` plug-in; the runner treats it no differently. Its training recipe (AdamW at --lr,
a linear warmup over AAM_WARMUP_STEPS, clipping at AAM_MAX_GRAD_NORM) is its own, as a task's would be:
--warmup-steps and --max-grad-norm replace it.
With --eval-every it holds out a seeded split of the samples (--eval-samples, default 1/8, at least one batch):
training draws from the rest, and each eval pass runs the same loss on the held-out batches in eval() + no_grad.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from debug_nan.aam.data.batches import Collator, check_batch
from debug_nan.aam.data.loading import Dataset, find_data_files, load_dataset
from debug_nan.aam.data.synthetic import synthesize
from debug_nan.aam.data.tokens import PAD, VOCAB_SIZE
from debug_nan.aam.data.unifrac import compute_unifrac
from debug_nan.aam.model.aam import AAMConfig, AAMModel
from debug_nan.drivers.recipe import linear_warmup
from debug_nan.drivers.task import Task
from debug_nan.engine.session import distributed
from debug_nan.errors import InputError
from debug_nan.aam.settings import AAMData, AAMSettings
from debug_nan.settings.training import TrainSettings

AAM_WARMUP_STEPS = 2
AAM_MAX_GRAD_NORM = 1.0


class EpochBatches:
    """Iterable of collated batches: each iteration is one epoch in a new seeded order (last partial dropped).

    Under torchrun it is a distributed sampler: the epoch's order is the same on every rank and rank r takes
    samples r, r + world, r + 2 world, ... of it."""

    sharded = True

    def __init__(self, collate: Collator, samples: np.ndarray, batch_size: int, seed: int, rank: int = 0,
                 world: int = 1):
        """samples: the sample indices to draw from (all of them, or the training part of a held-out split)."""
        self.collate, self.samples, self.batch_size, self.seed = collate, samples, batch_size, seed
        self.rank, self.world = rank, world
        self.epoch = 0

    def __iter__(self):
        order = self.samples[np.random.default_rng((self.seed, self.epoch)).permutation(self.samples.size)]
        order = order[self.rank::self.world]
        self.epoch += 1
        for start in range(0, order.size - self.batch_size + 1, self.batch_size):
            yield self.collate(order[start:start + self.batch_size])


class HeldOutBatches:
    """The held-out samples in fixed batches of batch_size (the last partial one dropped: UniFrac needs pairs),
    collated when iterated; every eval pass sees the same batches. Not sharded: each rank evaluates them all."""

    def __init__(self, collate: Collator, samples: np.ndarray, batch_size: int):
        self.collate, self.samples, self.batch_size = collate, samples, batch_size

    def __iter__(self):
        for start in range(0, self.samples.size - self.batch_size + 1, self.batch_size):
            yield self.collate(self.samples[start:start + self.batch_size])


def held_out_split(n_samples: int, s: AAMData, train: TrainSettings, world: int) -> tuple[np.ndarray,
                                                                                         np.ndarray | None]:
    """(training sample indices, held-out indices or None): a seeded split, only when an eval pass is asked for."""
    everything = np.arange(n_samples)
    if not train.eval_every:
        return everything, None
    held = s.eval_samples if s.eval_samples is not None else max(s.batch_size, n_samples // 8 // s.batch_size
                                                                 * s.batch_size)
    if held < s.batch_size:
        raise InputError(f"--eval-samples {held} is fewer than one batch (--batch-size {s.batch_size}).")
    if n_samples - held < s.batch_size * world:
        raise InputError(f"--eval-samples {held} leaves {n_samples - held} of the {n_samples} samples for training, "
                         f"fewer than one batch (--batch-size {s.batch_size} x {world} rank(s)); lower "
                         f"--eval-samples or --batch-size.")
    order = np.random.default_rng((train.seed, 8)).permutation(n_samples)
    return np.sort(order[held:]), np.sort(order[:held])


def aam_loss(model: torch.nn.Module, batch: dict, nuc_weight: float = 1.0, unifrac_weight: float = 1.0) -> dict:
    """UniFrac regression over the off-diagonal pairs + nucleotide cross-entropy over non-padding positions."""
    out = model(batch["tokens"], batch.get("used_slots"))
    pred, target = out["unifrac"].float(), batch["unifrac"]
    b = target.shape[0]
    off_diagonal = 1.0 - torch.eye(b, device=target.device)
    unifrac = ((pred - target) ** 2 * off_diagonal).sum() / (b * (b - 1))
    nucleotides = F.cross_entropy(out["nucleotides"].reshape(-1, VOCAB_SIZE).float(), batch["tokens"].reshape(-1),
                                  ignore_index=PAD)
    return {"loss": unifrac_weight * unifrac + nuc_weight * nucleotides, "unifrac": unifrac,
            "nucleotides": nucleotides}


def load_or_synthesize(s: AAMData, seed: int, log) -> Dataset:
    """--table/--tree, else the files in --data-dir, else synthetic data.

    Synthetic data only when no data was asked for: --data-dir left at its default (./data) and no table there.
    A --data-dir given explicitly (flag or config) must exist and hold a *.biom, else exit 2."""
    table = Path(s.table) if s.table else None
    tree = Path(s.tree) if s.tree else None
    default_dir = Path(s.data_dir) == Path(AAMData.data_dir)
    if table is None:
        found_table, found_tree = find_data_files(s.data_dir, required=not default_dir)
        table, tree = found_table, tree or found_tree
    elif tree is None:
        tree = find_data_files(table.parent)[1]
    if table is None:
        if tree is not None:
            raise InputError(f"Found tree {tree} but no BIOM table (*.biom) in {s.data_dir}; pass --table FILE.")
        if s.sequences:
            raise InputError(f"--sequences {s.sequences} was given but no BIOM table: {s.data_dir} has none; pass "
                             f"--table FILE (or --data-dir) with the table whose IDs the FASTA maps.")
        where = "has no *.biom table" if Path(s.data_dir).is_dir() else "does not exist"
        return synthesize(s.synthetic_samples, s.token_limit, seed, log,
                          reason=f"No --table given and {s.data_dir} (the default --data-dir) {where}")
    return load_dataset(table, tree, s.sequences, s.rarefy_depth, seed, log)


def build_aam_task(aam: AAMSettings, train: TrainSettings, log=print) -> Task:
    """The built-in task from its settings and the run's training ones it reads (the seed, the eval pass)."""
    s, seed = aam.data, train.seed
    data = load_or_synthesize(s, seed, log)
    for note in data.notes + data.token_report.policy_lines():
        log(note)
    if s.batch_size < 2 or s.batch_size % 2:
        raise InputError(f"--batch-size {s.batch_size}: the UniFrac target needs pairs of samples, so the batch "
                         f"size must be an even number >= 2.")
    if data.n_samples < 2:  # no batch size can help: one sample never forms a UniFrac pair
        raise InputError(f"{data.source} holds {data.n_samples} sample(s){' after rarefying' if s.rarefy_depth else ''}"
                         f": the UniFrac target needs pairs of samples, so at least 2 are needed (a smaller "
                         f"--batch-size cannot help). Add "
                         f"samples{' or lower --rarefy-depth' if s.rarefy_depth else ''}.")
    if s.batch_size > data.n_samples:
        raise InputError(f"--batch-size {s.batch_size} is larger than the {data.n_samples} samples of "
                         f"{data.source}; lower --batch-size.")
    distances = compute_unifrac(data.counts, data.asv_ids, data.sample_ids, data.tree, s.unifrac, log=log)
    richness = data.richness()
    over = int((richness > s.token_limit).sum())
    log(f"Token limit {s.token_limit}: {over} of {data.n_samples} samples hold more ASVs and are truncated "
        f"(--asv-order {s.asv_order}); {int((richness < s.token_limit).sum())} leave padding slots.")
    collate = Collator(data, distances, s.token_limit, s.asv_order, seed)
    ctx = distributed.detect()
    rank, world = (ctx.rank, ctx.world) if ctx else (0, 1)
    if s.batch_size * world > data.n_samples:
        raise InputError(f"--batch-size {s.batch_size} x {world} ranks needs {s.batch_size * world} samples; "
                         f"{data.source} has {data.n_samples}.")
    kept, held = held_out_split(data.n_samples, s, train, world)
    if held is not None:
        log(f"Held out {held.size} of {data.n_samples} samples for the eval pass (--eval-samples); training draws "
            f"from the other {kept.size}.")
    task = build_aam_model_task(aam, seed, batches=EpochBatches(collate, kept, s.batch_size, seed, rank, world),
                                eval_batches=HeldOutBatches(collate, held, s.batch_size) if held is not None else None)
    n_params = sum(p.numel() for p in task.model.parameters())
    m = aam.model
    log(f"AAM model: d_model {m.d_model}, {m.heads} heads, layers {m.asv_layers} ASV / {m.sample_layers} sample / "
        f"{m.encoder_layers} encoder, {n_params:,} parameters, guards {'on' if m.guards else 'OFF (pre-fix)'}"
        f"{', ASV encoder nn.TransformerEncoder' if m.asv_encoder == 'torch' else ''}.")
    return task


def describe_aam_batch(batch) -> list[str]:
    report = check_batch(batch)
    return report.lines() + [f"WARNING: {p}" for p in report.problems]


def build_aam_model_task(aam: AAMSettings, seed: int, batches, eval_batches=None) -> Task:
    """The built-in model and loss around any batches (a repro bundle's, for a replay without the data); the eval
    pass runs the same loss."""
    cfg = AAMConfig.from_settings(aam)
    torch.manual_seed(seed)
    weights = aam.model.nuc_weight, aam.model.unifrac_weight

    def loss(model, batch):
        return aam_loss(model, batch, *weights)

    return Task(model=AAMModel(cfg), batches=batches, loss=loss, describe_batch=describe_aam_batch,
                scheduler=lambda optimizer: linear_warmup(optimizer, AAM_WARMUP_STEPS),
                max_grad_norm=AAM_MAX_GRAD_NORM, name="aam (built-in)", eval_batches=eval_batches)
