"""An event file written by --tensorboard, read back with TensorBoard's own reader (the tests importorskip it)."""


def read_back(folder):
    """The EventAccumulator of the one event file in `folder`, loaded whole."""
    from tensorboard.backend.event_processing import event_accumulator

    (event,) = list(folder.glob("events.out.tfevents.*"))
    acc = event_accumulator.EventAccumulator(str(event), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def values(acc, tag):
    """[(step, value)] of a scalar tag."""
    return [(e.step, e.value) for e in acc.Scalars(tag)]
