"""The LightningModule around the plain-torch draft head (eagle3.draft).

Metrics are reduced as counts: each rank sums (loss, correct, total) per TTT step and
the sums are all-reduced before dividing, so a rank with more tokens weighs more (a
mean of per-rank means would not).
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer
from omegaconf import OmegaConf

from eagle3.config.choices import LossTokens
from eagle3.config.training import TrainConfig
from eagle3.draft.feature_noise import add_feature_noise
from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.loss import StepCounts, eagle3_loss, step_weighted
from eagle3.draft.onpolicy import OnPolicyLoss, mixed_loss, onpolicy_loss
from eagle3.draft.replay import replay_counts, replay_metrics
from eagle3.training.checkpoint_io import head_checkpoint_bytes
from eagle3.training.schedule import BudgetedCosine

NO_BAD_STEP = 2**62  # _first_bad_step when every loss so far was finite (above any step: a min over ranks)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf at a named step (a diverged run)."""


def _compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Eagle3LitModule(L.LightningModule):
    def __init__(
        self,
        head: Eagle3DraftHead,
        train_cfg: TrainConfig,
        export_meta: dict[str, Any] | None = None,
        replay_draft_tokens: int = 3,
        replay_max_answer_tokens: int | None = None,
    ):
        super().__init__()
        # the arguments in the checkpoint's hyper_parameters as plain data (enums as their values):
        # a resume reads the checkpoint with torch.load(weights_only=True), which refuses
        # dataclasses and enums. The head is in state_dict, export_meta in eagle3_meta; W&B
        # already holds the whole run config, so nothing goes to the logger
        self.save_hyperparameters(
            {
                "train_cfg": OmegaConf.to_container(OmegaConf.structured(train_cfg), enum_to_str=True),
                "replay_draft_tokens": replay_draft_tokens,
                "replay_max_answer_tokens": replay_max_answer_tokens,
            },
            logger=False,
        )
        self.head = head
        # what `python export.py ckpt=...` needs besides weights (DraftMeta as a dict)
        self.export_meta = export_meta or {}
        self.train_cfg = train_cfg
        self.ttt_steps = train_cfg.ttt_steps
        self.loss_kind = train_cfg.loss.value
        self.train_all_tokens = LossTokens(train_cfg.loss_tokens) is LossTokens.all
        # frozen target copies are rebuilt from the target, never stored in checkpoints
        self.strict_loading = False
        # validation also replays serving's drafting rounds (eagle3/draft/replay.py) with the
        # evaluation's K (eval.num_draft_tokens, at most the TTT steps trained; 0 = off) and
        # answer length (eval.max_new_tokens): the train-side figure that vLLM's should match
        self.replay_k = min(replay_draft_tokens, self.ttt_steps)
        self.replay_max_answer_tokens = replay_max_answer_tokens
        # per validation set (the validation split "val", the selection set "select"): step counts, replay counts
        self._val_sums: dict[str, tuple[StepCounts, torch.Tensor]] = {}
        # the on-policy objective's share (eagle3/draft/onpolicy.py; 0: the supervised loss alone)
        # and its rounds' K: the evaluation's, or every TTT step when the replay is off
        self.onpolicy_weight = float(train_cfg.onpolicy_weight)
        self.onpolicy_k = self.replay_k if self.replay_k > 0 else self.ttt_steps
        self._step = self._forward_loss
        self._mixed_step = self._forward_mixed
        self._compiled = False  # train.compile took effect (setup)
        self.lr_schedule: BudgetedCosine | None = None
        self._restored_schedule: dict | None = None  # from a checkpoint, applied when the schedule is built
        # the first step whose training loss was NaN or Inf (NO_BAD_STEP: none), kept on the
        # device so a step never waits for it; read every log_every_n_steps and before a save
        self._first_bad_step: torch.Tensor | None = None

    # ---- frozen weights stay out of checkpoints (Kimi's embeddings alone are 4.7 GB fp32)
    def _frozen_keys(self) -> set[str]:
        return {f"head.{n}" for n, p in self.head.named_parameters() if not p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.raise_if_diverged()  # before a checkpoint holds weights a non-finite loss stepped with
        frozen = self._frozen_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}
        checkpoint["eagle3_meta"] = self.export_meta
        if self.lr_schedule is not None:  # a time-budgeted schedule's progress (schedule.py)
            checkpoint["eagle3_lr_schedule"] = self.lr_schedule.state_dict()

    def checkpoint_bytes(self) -> int:
        """What one resume checkpoint of this module holds (eagle3/training/checkpoint_io.py): at
        Kimi-K2.5's width the head has 1.14B trainable parameters, 13.7 GB with AdamW's moments."""
        return head_checkpoint_bytes(self.head)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._restored_schedule = checkpoint.get("eagle3_lr_schedule")
        if self.lr_schedule is not None and self._restored_schedule is not None:
            self.lr_schedule.load_state_dict(self._restored_schedule)

    # ---- steps
    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device.type if self.trainer is not None else "cpu"
        if getattr(self.head, "attention", "sdpa") == "flex" and device != "cuda":
            raise ValueError(
                f"train.attention=flex: expected a CUDA device, got {device} "
                "(FlexAttention has no backward on CPU); use train.attention=sdpa"
            )
        # null = off (see train.compile in the schema). The datamodule pads every row to
        # max_tokens_per_batch when compiling: one static shape, one graph (dynamic shapes
        # recompiled for new row lengths on the H200). The on-policy step compiles the same way:
        # its rounds are walked as tensors (replay.round_starts), one static graph with the head
        compiled = self.train_cfg.compile
        self._compiled = bool(compiled)
        self._step = torch.compile(self._forward_loss, dynamic=False) if compiled else self._forward_loss
        self._mixed_step = torch.compile(self._forward_mixed, dynamic=False) if compiled else self._forward_mixed
        self._graphs_before = _compiled_graphs()  # the counter is per process (other compiles, tests)

    def _logits(self, batch: dict[str, torch.Tensor]):
        """(draft logits per TTT step, the teacher's logits [B, T, V], covered [B, T] or None): the
        teacher from the final state or from the stored top-k, by the batch's keys (head.teacher_logits)."""
        step_logits = self.head(
            batch["aux_hidden"], batch["input_ids"], batch["position_ids"], batch["segment_ids"], self.ttt_steps
        )
        with torch.no_grad():
            target_logits, covered = self.head.teacher_logits(batch)
        return step_logits, target_logits, covered

    def _forward_loss(self, batch: dict[str, torch.Tensor]):
        # the training positions (train.loss_tokens): the answers, or every token of a sample
        loss_mask = batch["segment_ids"] >= 0 if self.train_all_tokens else batch["loss_mask"]
        step_logits, target_logits, covered = self._logits(batch)
        return self._loss(batch, step_logits, target_logits, loss_mask, covered)

    def _loss(self, batch: dict[str, torch.Tensor], step_logits, target_logits, loss_mask: torch.Tensor, covered):
        return eagle3_loss(
            step_logits,
            target_logits,
            loss_mask=loss_mask,
            segment_ids=batch["segment_ids"],
            step_decay=self.train_cfg.step_decay,
            kind=self.loss_kind,
            covered=covered,
        )

    def _forward_mixed(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, StepCounts, OnPolicyLoss]:
        """(mixed loss, its supervised part, that part's counts, the on-policy part), both parts on
        the same logits; the rounds are the current head's on the answers (serving drafts nothing
        else)."""
        loss_mask = batch["segment_ids"] >= 0 if self.train_all_tokens else batch["loss_mask"]
        step_logits, target_logits, covered = self._logits(batch)
        supervised, counts = self._loss(batch, step_logits, target_logits, loss_mask, covered)
        onpolicy = onpolicy_loss(
            step_logits,
            target_logits,
            loss_mask=batch["loss_mask"],
            segment_ids=batch["segment_ids"],
            num_draft_tokens=self.onpolicy_k,
            decay=self.train_cfg.onpolicy_decay,
            round_starts_only=self.train_cfg.onpolicy_round_starts,
            covered=covered,
        )
        return mixed_loss(supervised, onpolicy.loss, self.onpolicy_weight), supervised.detach(), counts, onpolicy

    def _metrics(self, counts: StepCounts, prefix: str) -> dict[str, torch.Tensor]:
        loss_k, acc_k, cond_k = counts.loss_mean(), counts.acc_full(), counts.acc_cond()
        out: dict[str, torch.Tensor] = {}
        for k in range(self.ttt_steps):
            out[f"{prefix}/loss_k{k}"] = loss_k[k]
            out[f"{prefix}/acc_k{k}"] = acc_k[k]
            out[f"{prefix}/cond_acc_k{k}"] = cond_k[k]
        out[f"{prefix}/sim_accept_len"] = 1 + acc_k.sum()
        return {k: v.float() for k, v in out.items()}

    def _note_loss(self, loss: torch.Tensor) -> None:
        """Remember, on the device, the first step whose loss is not finite (no wait for the device:
        the step goes in as a python scalar, a kernel argument, never as a tensor made on the device,
        which would be a host-to-device copy and a wait each step)."""
        if self._first_bad_step is None or self._first_bad_step.device != loss.device:
            self._first_bad_step = torch.full((), NO_BAD_STEP, device=loss.device, dtype=torch.int64)
        bad_now = ~torch.isfinite(loss.detach()) & (self._first_bad_step == NO_BAD_STEP)
        self._first_bad_step = torch.where(bad_now, int(self.global_step), self._first_bad_step)

    def raise_if_diverged(self) -> None:
        """NonFiniteLossError naming the first step whose loss was NaN or Inf (on any rank), if
        one was; every rank calls it at the same step (it reduces across ranks)."""
        if self._first_bad_step is None:
            return
        first = self._first_bad_step
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1:
            first = trainer.strategy.reduce(first.clone(), reduce_op="min")
        step = int(first)
        if step != NO_BAD_STEP:
            raise NonFiniteLossError(
                f"train/loss: expected a finite value, got a non-finite one at step {step} (global_step; "
                f"stopped at step {self.global_step}): the training diverged, and no checkpoint holds the "
                "weights it stepped to (lower train.lr, keep train.grad_clip on, check the dataset)"
            )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer = self._trainer
        every = max(1, int(getattr(trainer, "log_every_n_steps", 1) or 1))
        if self.global_step % every == 0 or self.device.type == "cpu":  # a device wait on GPU: not each step
            self.raise_if_diverged()

    def training_step(self, batch, batch_idx):
        # outside the compiled step: the graph stays the validation's too (noise is for training only)
        noise = float(self.train_cfg.feature_noise)
        if noise > 0:
            aux = add_feature_noise(batch["aux_hidden"], noise, self.head.cfg.num_aux_layers)
            batch = {**batch, "aux_hidden": aux}
        onpolicy = None
        if self.onpolicy_weight > 0:
            loss, supervised, counts, onpolicy = self._mixed_step(batch)
        else:
            loss, counts = self._step(batch)
        self._note_loss(loss)
        logs = self._metrics(counts, "train")
        if onpolicy is not None:  # its loss, its parts and the current head's rounds on the batch
            logs.update(onpolicy.metric_tensors("train/"))
            logs["train/supervised_loss"] = supervised.float()
        logs["train/loss"] = loss.detach().float()
        if self._compiled:  # (a bound method is a new object at each access: no identity test)
            # graphs dynamo compiled so far: one static shape means it stays at 1 after the
            # first step; a rise is a recompile (a new shape or a guard that failed)
            logs["train/compiled_graphs"] = torch.tensor(float(_compiled_graphs() - self._graphs_before))
        # no prog_bar=True here: Lightning reads bar metrics after every batch, a device wait per
        # step (the bar shows train/loss every few steps instead: SparseProgressBar)
        self.log_dict(logs, on_step=True, batch_size=1)
        return loss

    @property
    def _val_counts(self) -> StepCounts:
        """The validation split's step counts of the last validation."""
        return self._val_sums["val"][0]

    @property
    def _val_replay(self) -> torch.Tensor:
        """The validation split's replay counts of the last validation."""
        return self._val_sums["val"][1]

    def _val_set_names(self) -> list[str]:
        """The metric prefix of each validation loader, in order (the data module's names)."""
        datamodule = getattr(self._trainer, "datamodule", None)
        names = getattr(datamodule, "val_set_names", None)
        return list(names) if names else ["val"]

    def on_validation_epoch_start(self) -> None:
        # every set on every rank, batches or not: the sums are reduced across ranks set by set
        self._val_sums = {
            name: (
                StepCounts.zeros(self.ttt_steps, device=self.device),
                torch.zeros(2 + max(self.replay_k, 0), dtype=torch.float64),
            )
            for name in self._val_set_names()
        }

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        # eager even when training is compiled: validation rows vary in length, and the
        # replay needs the per-step logits
        step_logits, target_logits, covered = self._logits(batch)
        _, counts = self._loss(batch, step_logits, target_logits, batch["loss_mask"], covered)  # the answers
        name = self._val_set_names()[dataloader_idx]
        total, replay = self._val_sums[name]
        total = total + StepCounts.from_stacked(counts.stacked())
        if self.replay_k > 0:
            replay = replay + replay_counts(
                step_logits,
                target_logits,
                loss_mask=batch["loss_mask"],
                segment_ids=batch["segment_ids"],
                num_draft_tokens=self.replay_k,
                max_answer_tokens=self.replay_max_answer_tokens,
                covered=covered,
            )
        self._val_sums[name] = (total, replay)

    def on_validation_epoch_end(self) -> None:
        metrics: dict[str, torch.Tensor] = {}
        for name, (counts, replay) in self._val_sums.items():
            metrics.update(self._val_metrics(name, counts, replay))
        # already reduced across ranks: no sync_dist (it would average, not sum), and Lightning's
        # advice to add it (one warning per metric, ~30 lines per DDP validation) does not apply
        warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('(val|select)(/|_)")
        self.log_dict(metrics, sync_dist=False)
        if "val/sim_accept_len" in metrics:
            self.log("val_accept", metrics["val/sim_accept_len"], prog_bar=True, logger=False)
        for name in ("val", "select"):  # the replay vLLM reproduces (docs/records/, train-side estimates)
            if f"{name}/replay_accept_len" in metrics:
                self.log(f"{name}_replay", metrics[f"{name}/replay_accept_len"], prog_bar=True, logger=False)

    def _val_metrics(self, name: str, counts: StepCounts, replay: torch.Tensor) -> dict[str, torch.Tensor]:
        """One validation set's metrics under ``name``/, its counts summed over ranks first."""
        stacked = counts.stacked()
        if self.trainer.world_size > 1:
            stacked = self.trainer.strategy.reduce(stacked, reduce_op="sum")  # counts, not means
        counts = StepCounts.from_stacked(stacked)
        metrics = self._metrics(counts, name)
        # the step weighting training's loss has (eagle3_loss), over the answers' per-step means
        step_losses = [metrics[f"{name}/loss_k{k}"] for k in range(self.ttt_steps)]
        metrics[f"{name}/loss"] = step_weighted(step_losses, self.train_cfg.step_decay)
        metrics[f"{name}/tokens"] = counts.loss_count[0].float()
        if self.replay_k > 0:
            replay = replay.to(self.device)
            if self.trainer.world_size > 1:
                replay = self.trainer.strategy.reduce(replay, reduce_op="sum")
            acc = counts.acc_full()
            # the uniform estimate at the replay's K, for a like-for-like comparison
            metrics[f"{name}/sim_accept_len_k{self.replay_k}"] = 1 + acc[: self.replay_k].sum().float()
            metrics.update(
                {
                    k: torch.tensor(v, dtype=torch.float32, device=self.device)
                    for k, v in replay_metrics(replay.cpu(), prefix=f"{name}/").items()
                }
            )
        return metrics

    # ---- optimisation
    def configure_optimizers(self):
        params = [p for p in self.head.parameters() if p.requires_grad]
        tc = self.train_cfg
        if tc.optimizer.name.lower() != "adamw":
            raise ValueError(f"train.optimizer.name: expected adamw, got {tc.optimizer.name!r}")
        beta1, beta2 = tc.optimizer.betas
        opt = torch.optim.AdamW(
            params,
            lr=tc.lr,
            betas=(beta1, beta2),
            eps=tc.optimizer.eps,
            weight_decay=tc.weight_decay,
        )
        self.lr_schedule = BudgetedCosine(
            warmup=tc.warmup_steps,
            total_steps=tc.lr_decay_steps or tc.max_steps,
            min_ratio=tc.min_lr_ratio,
            clock=self._budget_clock(),
        )
        if self._restored_schedule is not None:
            self.lr_schedule.load_state_dict(self._restored_schedule)
        # a plain function, not the object: LambdaLR would pickle the object's clock with it
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cast(BudgetedCosine, self.lr_schedule)(s))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _budget_clock(self):
        """(elapsed, remaining) seconds of train.max_time from Lightning's Timer, or None when
        the run has no time budget (the schedule is then the closed-form cosine)."""
        trainer: Any = self._trainer  # Lightning sets .callbacks without declaring it
        timer = next((c for c in (trainer.callbacks if trainer else []) if isinstance(c, Timer)), None)
        if timer is None or not self.train_cfg.max_time:
            return None
        return lambda: (timer.time_elapsed("train"), timer.time_remaining("train"))
