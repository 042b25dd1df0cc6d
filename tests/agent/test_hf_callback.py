"""The Hugging Face Trainer callback, driven by a real `transformers.Trainer` on CPU: a tiny GPT-2 built
from a config (no download), two epochs. The agent's CUDA side is a ReplaySource of real H200
snapshots (this machine has no GPU); delivery goes to the shared Redis under a test prefix."""

from __future__ import annotations

import torch  # the test extras install both: pip install -e '.[test]' torch==2.13.0
import transformers

from memq.agent.source import ReplaySource
from tests.agent.conftest import REAL, entries


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def test_trainer_callback_drives_the_agent(shared, tmp_path):
    from memq import agent
    from memq.agent.integrations import hf_callback

    r, prefix, stream = shared
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=4, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0)
    cb = hf_callback(run="hf-run", cluster="cpu", source=ReplaySource(REAL / "seed_adamw"), stream=stream,
                     key_prefix=prefix, signal=None, fsync=False, stats_interval_s=0, snapshot_every_s=0,
                     backoff_s=(0.05, 0.2))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(24, 16, 64), callbacks=[cb])
    trainer.train()

    assert cb.handle is not None and cb.handle.stopped, "on_train_end stops the agent"
    assert agent.current() is cb.handle
    got = entries(r, stream)
    kinds = [e.kind for e in got]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end", kinds
    start = got[0].payload
    assert start["optimizer"] == "AdamW", start.get("optimizer")  # the optimizer, not accelerate's wrapper
    assert start["model"] == "GPT2LMHeadModel"
    assert start["params"] == sum(p.numel() for p in model.parameters())
    snaps = [e for e in got if e.kind == "snapshot"]
    ends = [(s.epoch, s.step) for s in snaps if s.trigger == "epoch_end"]
    assert ends == [(0, 6), (1, 12)], ends  # 24 samples / batch 4 = 6 steps an epoch; global_step counts from 1
    marked = [x["step"] for e in got if e.kind == "stats" for x in e.payload["samples"]
              if x.get("step") is not None]
    assert set(range(1, 13)) <= set(marked), marked  # every Trainer step reached the agent
    assert max(marked) == 12
    end = got[-1].payload
    assert end["status"] == "completed" and end["step"] == 12
    assert cb.handle.counters()["errors"] == 0
