"""The value model: estimated probability of success at every token position, trained online.

``V(t)`` is the model's estimate of the episode's expected final reward (the probability of
success for the built-in 0/1 rewards) given the tokens ``0..t``; the value *of a segment
boundary* is ``V`` at the last token before the next model turn. Two kinds (``credit.value.kind``):

* ``head``: a two-layer MLP on the policy backbone's final hidden states. The backbone runs
  without gradient, so the policy and its optimiser are untouched; only the head learns.
* ``separate``: a tiny transformer of the policy's family (``hidden_size``, ``num_layers``) with
  the same vocabulary and its own head, trained end to end.

Either way the value model has its own AdamW optimiser and is trained with the clipped value
loss (:func:`asyncrl.algo.value_loss`) on Monte-Carlo targets: every position before a model
token is regressed on the episode's final reward. Outputs pass through a sigmoid (values in
``(0, 1)``). Weights are saved as safetensors (no pickle).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from asyncrl.algo import value_loss
from asyncrl.config import ModelConfig, ValueModelConfig

if TYPE_CHECKING:
    from asyncrl.policy.model import Policy


class ValueModel:
    def __init__(self, vcfg: ValueModelConfig, policy: Policy, family: str, seed: int) -> None:
        from asyncrl.policy.model import build_model, input_vocab_size

        self.cfg, self.policy = vcfg, policy
        self.backbone: Any = None
        width = int(policy.model.config.hidden_size)
        if vcfg.kind == "separate":
            h = vcfg.hidden_size
            heads = max(1, h // 16) if h % max(1, h // 16) == 0 else 1
            mcfg = ModelConfig(
                family=family,
                hidden_size=h,
                num_layers=vcfg.num_layers,
                num_heads=heads,
                num_kv_heads=heads,
                intermediate_size=max(8, 3 * h),
                max_context=policy.max_context,
                seed=seed + 1,
            )
            self.backbone = build_model(mcfg, input_vocab_size(policy.model)).model
            width = h
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 2)
            self.head = torch.nn.Sequential(
                torch.nn.Linear(width, vcfg.hidden_size),
                torch.nn.Tanh(),
                torch.nn.Linear(vcfg.hidden_size, 1),
            )
        self.device = policy.device
        nets = [self.head] if self.backbone is None else [self.head, self.backbone]
        self.optimizer = torch.optim.AdamW(
            [p for n in nets for p in n.to(self.device).parameters()], lr=vcfg.lr
        )

    def _features(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        from asyncrl.policy.model import padded_attention_inputs

        net = self.backbone if self.backbone is not None else self.policy.model.model
        ids, attn = ids.to(self.device), attn.to(self.device)
        mask4d, pos = padded_attention_inputs(attn, net.config._attn_implementation)
        with torch.no_grad() if self.backbone is None else contextlib.nullcontext():  # a head: frozen trunk
            out = net(input_ids=ids, attention_mask=mask4d, position_ids=pos, use_cache=False)
        hidden: torch.Tensor = out.last_hidden_state.float()
        return hidden

    def forward(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` in (0, 1) with gradient to the value model's parameters."""
        return torch.sigmoid(self.head(self._features(ids, attn)).squeeze(-1))

    def predict(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` on the host (credit assignment is host-side work)."""
        with torch.no_grad():
            return self.forward(ids, attn).detach().cpu()

    def train(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        vmask: torch.Tensor,
        targets: torch.Tensor,
        old: torch.Tensor,
    ) -> dict[str, float]:
        """``epochs`` optimiser steps of the clipped value loss; returns its metrics."""
        metrics: dict[str, float] = {}
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        vmask, targets, old = (t.to(self.device) for t in (vmask, targets, old))
        for epoch in range(self.cfg.epochs):
            pred = self.forward(ids, attn)
            loss, m = value_loss(pred, old, targets, vmask, self.cfg.clip)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            gn = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
            if not (torch.isfinite(loss) and torch.isfinite(gn)):
                self.optimizer.zero_grad(set_to_none=True)
                metrics["value/skipped"] = 1.0
                continue
            self.optimizer.step()
            if epoch == 0:
                metrics["value/loss_start"] = m["loss/value"]
            metrics.update(m)
            metrics["value/grad_norm"] = float(gn)
        return metrics

    # -- persistence -------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {
            f"head.{k}": v.detach().to("cpu", copy=True).contiguous()
            for k, v in self.head.state_dict().items()
        }
        if self.backbone is not None:
            from asyncrl.policy.tensors import state_dict_tensors

            out.update({f"backbone.{k}": v for k, v in state_dict_tensors(self.backbone).items()})
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        head = {k[5:]: v for k, v in tensors.items() if k.startswith("head.")}
        self.head.load_state_dict(head)
        if self.backbone is not None:
            from asyncrl.policy.tensors import load_tensors

            load_tensors(self.backbone, {k[9:]: v for k, v in tensors.items() if k.startswith("backbone.")})

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file(self.state_tensors(), str(tmp), metadata={"kind": self.cfg.kind})
        tmp.replace(path)

    def load(self, path: Path) -> None:
        self.load_state_tensors(load_file(str(path)))
