"""Lightning with the memq callback on a GPU (not CI): python lightning_check.py SPOOL_DIR"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from memq.agent.integrations import lightning_callback  # noqa: E402


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1))

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(2048, 1024), torch.randn(2048, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=128)
    cb = lightning_callback(run="gpu-lightning", cluster="h200", spool_dir=sys.argv[1])
    L.Trainer(max_epochs=2, accelerator="gpu", devices=1, callbacks=[cb], enable_progress_bar=False,
              logger=False, enable_checkpointing=False).fit(M(), loader)
    print("lightning counters", cb.handle.counters() if cb.handle else None)
