"""Which models and optimizers `debug-nan run` watches: the part of drivers/run/hooks.py's `Hooks` that knows them.

  * one optimizer whose parameters one module owns (the common loop): that module is the root, that optimizer the
    watched one; a newer optimizer of the same model that steps instead is followed (a second training stage);
  * several optimizers (a GAN's generator and discriminator, an actor and a critic, two optimizers over one model's
    halves), or one whose parameters no single module owns (two encoders and a bare `logit_scale`): every live
    optimizer at the first training forward is watched with the parameters it holds (drivers/run/ensemble.py);
    a forward of any of their models opens a micro-batch; a step is an optimizer step, and optimizers that step
    one after the other with no forward between them take one step together.
What it reads and writes is drivers/run/hook_state.py's HookState, the hooks' one state (`self.state`); the few
attributes of Hooks' own it uses are declared on the class.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from debug_nan.drivers.run.ensemble import Optimizers, cover, watched_set
from debug_nan.drivers.run.hook_state import HookState, Updates
from debug_nan.drivers.run.model_calls import leaves_reached, optimizer_params, owners
from debug_nan.drivers.run.sharding import held_parameter_ids, sharded_view
from debug_nan.drivers.run.stops import RunStopped
from debug_nan.drivers.wrappers import bare, wraps
from debug_nan.engine.watch.module_hooks import ModuleHook, keep_out_of_copies
from debug_nan.errors import InputError


class WatchedOptimizer:
    """Hooks' part that decides what is watched; its state is the hooks' (HookState), the rest Hooks' own."""

    state: HookState
    listener: object  # (hooks.py's Listener)
    failure: InputError | None
    _handles: list  # the hooks' handles, removed by uninstall()
    _forward_pre_hook: ModuleHook  # the model's forward hooks (Hooks.forward_pre, forward_post)
    _forward_post_hook: ModuleHook

    # -- optimizers created, models hooked ---------------------------------------------------------------------
    def created(self, optimizer: torch.optim.Optimizer) -> None:
        if self.state.root is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            found = owners(optimizer_params(optimizer))
            if not found:  # no module owns them all: the modules that own parts of them
                found = [m for outer in cover(params)[0] for m in {id(outer): outer, id(bare(outer)): bare(outer)}
                         .values()]
            self._hook_models(found)
        self.state.other_optimizers.append(weakref.ref(optimizer))

    def _hook_models(self, modules: list[nn.Module]) -> None:
        for module in modules:
            keep_out_of_copies(module)
            self._handles += [module.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True),
                              module.register_forward_hook(self._forward_post_hook, with_kwargs=True,
                                                           always_call=True)]

    def _adopt_by_backward(self, tensors) -> None:
        """No torch.optim optimizer has a model yet and a backward comes (a loop that updates the weights by hand):
        the model is the module that owns every parameter this backward reaches. Watched from its next forward;
        each forward after a backward then closes a step (the script's own update ran between them)."""
        found = owners(leaves_reached(tensors))
        self.state.updates = Updates.BY_HAND if found else Updates.UNOWNED
        if found:
            self.state.backward_since_open = True  # (this first step is over before the model is known)
            self._hook_models(found)

    def scheduler_of(self, optimizer):
        """The script's last LR scheduler of `optimizer` (its state is part of a step's start), or None."""
        live = [r() for r in self.state.schedulers]
        return next((s for s in reversed(live) if s is not None and wraps(s.optimizer, optimizer)), None)

    # -- the watched model -------------------------------------------------------------------------------------
    @property
    def several(self) -> bool:
        """Several optimizers are watched (ensemble.Optimizers)."""
        return isinstance(self.state.optimizer, Optimizers)

    def _is_model(self, module: nn.Module) -> bool:
        if self.state.models is not None:
            return id(bare(module)) in self.state.paths
        return module is self.state.root or bare(module) is bare(self.state.root)

    def model_path(self, module: nn.Module) -> str:
        """Several optimizers: where the module the script called sits in the watched model (its replay calls it
        there again): "netD" in a Models, "gen" in a LightningModule holding a GAN's two models, "" for itself."""
        return self.state.paths[id(bare(module))]

    def _adopt(self, module: nn.Module) -> bool:
        """Whether `module` is (one of) the watched model(s). The first time, what is watched is decided: the
        module, when it owns all the parameters of the one live optimizer (or of a loop's own update); every live
        optimizer and the models that hold their parameters, when there are several or none owns them all."""
        if self.state.root is not None:
            return self._is_model(module)
        model = bare(module)
        ids = held_parameter_ids(model)  # (FSDP2: the sharded parameters the optimizer holds)
        live = [o for o in (r() for r in self.state.other_optimizers) if o is not None]
        mine = [o for o in live if optimizer_params(o) <= ids]
        if (len(mine) == 1 and len(live) == 1) or (not live and self.state.manual):
            self.state.root, self.state.optimizer = module, mine[-1] if mine else None
            self.state.other_optimizers = []
            with sharded_view(model):  # (FSDP2: the watch and the copy read the optimizer's sharded parameters)
                self.listener.attach(model, self.state.optimizer)
            return True
        if not any(optimizer_params(o) & ids for o in live):  # its optimizer is gone already: not trained
            return False
        self.state.models, self.state.optimizer = watched_set(live)
        self.state.paths = {id(m): name for name, m in self.state.models.named_modules()}
        self.state.root, self.state.other_optimizers = self.state.models, []
        self.listener.attach(self.state.models, self.state.optimizer)
        return self._is_model(module)

    # -- which optimizer steps ---------------------------------------------------------------------------------
    def _mine(self, optimizer) -> bool:
        if isinstance(self.state.optimizer, Optimizers):
            return self.state.optimizer.index(optimizer) is not None
        if self.state.optimizer is None or optimizer is self.state.optimizer:
            return self.state.optimizer is not None
        if self._replaces(optimizer):
            return True
        if optimizer in self.state.retired or any(r() is optimizer for r in self.state.other_optimizers):
            watched = type(self.state.optimizer).__name__
            self.failure = InputError(f"the script steps an optimizer debug-nan run does not watch "
                                      f"({type(optimizer).__name__}) beside the {watched} it "
                                      f"trains with: one created after training began, for parameters that model "
                                      f"does not hold, or one that a newer optimizer of the same model had replaced "
                                      f"(a second stage), stepping again. debug-nan run watches every optimizer "
                                      f"that exists at the first training forward, each with the parameters it "
                                      f"holds: create them all before the first step, or use the Python API "
                                      f"(debug_nan.Monitor).")
            raise RunStopped("error")
        return False

    def _replaces(self, optimizer) -> bool:
        """A newer optimizer of the same model steps while the current one has not stepped in this step: it
        replaced it (a second training stage). The watch follows the newest."""
        if optimizer in self.state.retired or self.state.stepped_this_step or not any(
                r() is optimizer for r in self.state.other_optimizers):
            return False
        if not optimizer_params(optimizer) <= held_parameter_ids(self.state.root):
            return False
        self.state.retired.add(self.state.optimizer)
        self.state.other_optimizers = [r for r in self.state.other_optimizers if r() is not optimizer]
        self.state.optimizer = optimizer
        self.listener.follow(optimizer)
        return True

    def joins_step(self, optimizer, update) -> bool:
        """Several optimizers: `optimizer` steps right after another, with no forward between (two optimizers
        over one model's halves): it joins that step (its replay steps both, in order)."""
        if not self.state.step_pending:
            if update is not None and self.several:
                update.stepped = [self.state.optimizer.index(optimizer)]
            return False
        stepped = self.state.pending_update
        if stepped is not None:
            stepped.stepped.append(self.state.optimizer.index(optimizer))
        return True

    def flush_step(self) -> None:
        """Several optimizers: the step taken closes (at the next forward, or when training ends)."""
        if self.state.step_pending:
            self.state.step_pending = False
            self.state.pending_update = None
            self._close_step(skipped=False)
