"""Which optimizer `debug-nan run` watches when a script has several: the one that owns the model's parameters,
followed when a newer one replaces it (a second training stage), refused when two step at once (a GAN's)."""

from __future__ import annotations

from debug_nan.drivers.run.model_calls import optimizer_params
from debug_nan.drivers.run.stops import RunStopped
from debug_nan.errors import InputError


class WatchedOptimizer:
    """The part of launch/hooks.Hooks that tells whether an optimizer stepping is the watched one. Uses the hooks'
    optimizer, other_optimizers, retired, stepped_this_step, root, listener and failure."""

    def _mine(self, optimizer) -> bool:
        if self.optimizer is None or optimizer is self.optimizer:
            return self.optimizer is not None
        if self._replaces(optimizer):
            return True
        if optimizer in self.retired or any(r() is optimizer for r in self.other_optimizers):
            self.failure = InputError(f"the script steps two optimizers ({type(self.optimizer).__name__} and "
                             f"{type(optimizer).__name__}, e.g. a GAN's generator and discriminator): debug-nan run "
                             f"watches one optimizer and the model that owns its parameters. Use the Python API "
                             f"(debug_nan.Monitor) around one of them instead.")
            raise RunStopped("error")
        return False

    def _replaces(self, optimizer) -> bool:
        """A newer optimizer of the same model steps while the current one has not stepped in this step: it
        replaced it (a second training stage). The watch follows the newest; two that both step (a GAN's, or two
        halves of one model's parameters) stay a usage error."""
        if optimizer in self.retired or self.stepped_this_step or not any(
                r() is optimizer for r in self.other_optimizers):
            return False
        if not optimizer_params(optimizer) <= {id(p) for p in self.root.parameters()}:
            return False
        self.retired.add(self.optimizer)
        self.other_optimizers = [r for r in self.other_optimizers if r() is not optimizer]
        self.optimizer = optimizer
        self.listener.follow(optimizer)
        return True
