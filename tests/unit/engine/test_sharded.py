"""engine/sharded.py and what the engine does with a sharded model: names without wrapper segments, kept origins
that survive FSDP freeing a storage, every rank replaying together, which rank's outcome is reported."""

import os

import torch
from torch import nn

from debug_nan.engine.explain.evidence import module_type
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.session.agreement import MADE, RECEIVED, SEEN, RankPlan, _score
from debug_nan.engine.sharded import has_fsdp, locals_of, sharded_flags, user_path
from debug_nan.engine.trace.tracer import Tracer
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.frames import FSDP_CODE
from debug_nan.engine.watch.phase_codes import PHASE_CODE


def test_user_path_drops_every_wrapper_segment_and_nothing_else():
    assert user_path("_fsdp_wrapped_module.stages.0._fsdp_wrapped_module.encoder.self_attn") == \
        "stages.0.encoder.self_attn"
    assert user_path("_orig_mod.blocks.1._checkpoint_wrapped_module.mlp.fc") == "blocks.1.mlp.fc"
    assert user_path("_fsdp_wrapped_module") == ""
    assert user_path("_fsdp_wrapped_module.1._fsdp_wrapped_module") == "1"
    assert user_path("my_orig_mod.x") == "my_orig_mod.x" and user_path("head.weight") == "head.weight"


class Wrapper(nn.Module):
    """Stands for FSDP1's wrapper: the user's module under `_fsdp_wrapped_module`."""

    def __init__(self, inner):
        super().__init__()
        self._fsdp_wrapped_module = inner


def test_a_finding_names_the_module_as_the_user_wrote_it_with_its_own_type():
    model = Wrapper(nn.Sequential(nn.Linear(2, 2), Wrapper(nn.ReLU())))
    assert module_type(model, "1") == "ReLU" and module_type(model, "0") == "Linear"
    f = Finding(step=1, micro_step=1, phase="forward", module="_fsdp_wrapped_module.1._fsdp_wrapped_module",
                module_type="ReLU", op="aten.relu.default", kind="nan", cause="unknown", explanation="", source=None,
                suggestions=[])
    assert f.module == "1"


def test_plain_tensors_are_their_own_shards_and_a_plain_model_is_not_fsdp():
    a, b = torch.ones(2), torch.zeros(3)
    assert locals_of([a, b])[0] is a and sharded_flags([a, b]) == [False, False]
    assert not has_fsdp(nn.Linear(2, 2)) and has_fsdp(type("FullyShardedDataParallel", (nn.Module,), {})())


def test_a_sharded_model_keeps_private_copies_of_its_origins_tensors():
    """FSDP frees an unsharded parameter's storage after use (no op announces it): an origin must not point there."""
    model = type("FullyShardedDataParallel", (nn.Module,), {})()
    weight = torch.full((2,), 2.0 ** 126)
    with Tracer(model) as tr:
        out = weight * torch.tensor([8.0, 1.0])  # inf: an origin whose input is `weight`
    event = tr.origin_of(out)
    assert event.op == "aten.mul.Tensor" and event.inputs[0][1] is not weight
    weight.untyped_storage().resize_(0)  # what FSDP does to an unsharded parameter
    assert event.inputs[0][1].tolist() == [2.0 ** 126] * 2 and torch.isinf(event.outputs[0][1][0])


def in_fsdp_code(source: str, name: str):
    """A function whose code lives (by its file name) in FSDP's folder of torch, as FSDP's own functions do."""
    scope: dict = {"torch": torch}
    exec(compile(source, os.path.join(FSDP_CODE, "_stand_in.py"), "exec"), scope)
    return scope[name]


def test_garbage_in_a_buffer_fsdp_reallocated_is_no_origin_where_fsdp_meets_it():
    """FSDP1 re-allocates its all-gather buffer by resizing its storage (garbage until the all-gather writes it)
    and chunks it first: a NaN met there is no origin; the same NaN met in the user's code is one."""
    chunk = in_fsdp_code("def chunk(buffer):\n    return torch.chunk(buffer, 2)\n", "chunk")
    garbage, buffer = torch.tensor([float("nan"), 1.0, 2.0, 3.0]), torch.tensor([float("nan"), 1.0, 2.0, 3.0])
    with Tracer(type("FullyShardedDataParallel", (nn.Module,), {})()) as tr:
        halves = chunk(buffer)
        halves[0].copy_(torch.ones(2))  # (the all-gather writes it)
    assert tr.origins == [] and tr.first is None
    with Tracer(type("FullyShardedDataParallel", (nn.Module,), {})()) as tr:
        torch.chunk(garbage, 2)
    assert [e.label.split(",")[0] for e in tr.origins] == ["input `self` of aten.split.Tensor"]
    with Tracer(nn.Linear(1, 1)) as tr:  # (an unsharded model: no FSDP buffers to tell apart)
        chunk(garbage)
    assert len(tr.origins) == 1


def test_a_sharded_model_replays_on_every_rank_and_each_traces():
    plan = RankPlan(top=3.0, first=[1], together=True)
    assert [plan.replays(r) for r in (0, 1)] == [(True, True), (True, True)]
    alone = RankPlan(top=3.0, first=[1])
    assert [alone.replays(r) for r in (0, 1)] == [(False, True), (True, True)]
    bad_batch = RankPlan(top=PHASE_CODE[CheckKind.DATA], first=[1], together=True)  # no replay: none to take part in
    assert [bad_batch.replays(r) for r in (0, 1)] == [(False, True), (True, True)]


def test_an_op_made_here_outranks_a_value_received_and_a_watch_reading():
    def finding(op, detected_by="replay"):
        return Finding(step=1, micro_step=1, phase="loss", module="", module_type="", op=op, kind="nan",
                       cause="nonfinite_input" if not op else "overflow", explanation="", source=None,
                       suggestions=[], detected_by=detected_by)

    assert (_score(finding("aten.mm.default")), _score(finding("")), _score(finding(None, "watch"))) == (
        MADE, RECEIVED, SEEN)
    assert _score(None) == 0.0 and _score(RuntimeError("x")) == 0.0


def test_a_rank_s_abort_survives_its_broadcast():
    import pickle

    from debug_nan.engine.session.agreement import RunAborted

    again = pickle.loads(pickle.dumps(RunAborted("rank 0 failed while pinpointing", 1)))
    assert (str(again), again.exit_code) == ("rank 0 failed while pinpointing", 1)


def test_fsdp2_s_class_swap_is_shown_as_the_user_s_class():
    from debug_nan.engine.sharded import user_class

    class Stage(nn.Module):
        pass

    swapped = type("FSDPStage", (type("FSDPModule", (), {}), Stage), {})  # what fully_shard makes of Stage
    assert user_class(swapped) is Stage and user_class(Stage) is Stage


def test_a_collectives_output_buffer_is_judged_where_it_is_used_not_for_its_old_contents():
    """FSDP2 all-gathers into a buffer it re-allocated (garbage, a NaN now and then, until the collective writes
    it, maybe after the call returns): the garbage is no origin; a non-finite value the collective brings is met
    as a value made outside the traced ops where the script uses it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for model in (type("FullyShardedDataParallel", (nn.Module,), {})(), nn.Linear(1, 1)):
            garbage = torch.full((4,), float("nan"))
            with Tracer(model) as tr:
                dist.all_gather_into_tensor(garbage, torch.ones(4))
                total = (garbage * 2).sum()
            assert tr.origins == [] and total.item() == 8.0
        received, sent = torch.zeros(2), torch.tensor([1.0, float("inf")])
        with Tracer(nn.Linear(1, 1)) as tr:
            dist.all_gather_into_tensor(received, sent)
            harm = received * 2
        assert [e.label.split(",")[0] for e in tr.origins] == ["input `self` of aten.mul.Tensor"]
        assert tr.origin_of(harm) is tr.origins[0] and tr.origins[0].kind == "inf"
        # this rank's own NaN sent (in place, into a buffer, through a functional collective): the result carries it
        from torch.distributed import _functional_collectives as funcol

        gathered = torch.zeros(2)
        with Tracer(nn.Linear(1, 1)) as tr:
            mine = torch.log(torch.tensor([-1.0, 1.0]))
            dist.all_gather_into_tensor(gathered, mine)
            reduced = funcol.all_reduce(mine * 1, "sum", dist.group.WORLD)
            dist.all_reduce(mine)
            harms = (gathered + 1, reduced.wait() + 1 if hasattr(reduced, "wait") else reduced + 1, mine + 1)
        [log] = tr.origins
        assert log.op == "aten.log.default" and [tr.origin_of(h) for h in harms] == [log, log, log]
    finally:
        dist.destroy_process_group()


def test_a_replayed_gradient_is_compared_with_the_watchs_by_the_users_name():
    """FSDP1's flat parameter: the watch names it `_flat_param`, the replay's model `_fsdp_wrapped_module._flat_param`:
    the same gradient, so no "the run's kernels computed it otherwise"."""
    from debug_nan.engine.explain.explain import ReplayFacts, replay_differs
    from debug_nan.engine.watch.watch import Check

    seen = Check(CheckKind.GRAD, "_flat_param", float("nan"), "nan")
    assert replay_differs(seen, ReplayFacts(grads_nonfinite={"_fsdp_wrapped_module._flat_param"})) is None
    other = replay_differs(seen, ReplayFacts(grads_nonfinite={"_fsdp_wrapped_module.head._flat_param"}))
    assert "stayed finite, and 1 other parameter(s)' did not (`head._flat_param` first)" in other
