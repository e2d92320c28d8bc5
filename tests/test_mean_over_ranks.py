"""mean_over_ranks, the helper a converted training-loss print calls: each value's mean over the
ranks, several values (a GAN's two losses, tensors and numbers) in ONE all_reduce. Run on 2 ranks."""

from __future__ import annotations

import sys
import textwrap

from ddpify.codemods.ddp.runtime import HELPERS, MEAN_HELPER
from helpers import failure_report, run_script

CHECKS = textwrap.dedent("""\
    setup_distributed()
    calls = []
    reduce = dist.all_reduce
    dist.all_reduce = lambda tensor, *a, **k: calls.append(tensor.numel()) or reduce(tensor, *a, **k)
    d_loss = torch.tensor(1.0 + RANK, dtype=torch.float32)  # rank 0: 1, rank 1: 2
    g_loss = torch.tensor([[2.0 * RANK, 4.0]], dtype=torch.float16)
    running = 3 * RANK  # an int total
    d_avg, g_avg, running_avg = mean_over_ranks(d_loss, g_loss, running)
    assert calls == [4], calls  # one all_reduce of the four numbers
    assert d_avg.dtype == torch.float32 and d_avg.shape == () and d_avg.item() == 1.5
    assert g_avg.dtype == torch.float16 and g_avg.tolist() == [[1.0, 4.0]]
    assert isinstance(running_avg, float) and running_avg == 1.5
    loss_avg = mean_over_ranks(d_loss)
    assert calls == [4, 1] and loss_avg.dtype == torch.float32 and loss_avg.item() == 1.5  # one value: itself, not a tuple
    open(f"rank{RANK}.ok", "w").close()  # a file, not a print: the ranks' prints interleave
    cleanup_distributed()
    """)


def test_several_values_are_averaged_in_one_all_reduce_each_in_its_own_form(tmp_path):
    script = tmp_path / "means.py"
    script.write_text("import gc\nimport os\nimport torch\nimport torch.distributed as dist\n" + HELPERS + MEAN_HELPER + "\n" + CHECKS)
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                     tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert sorted(path.name for path in tmp_path.glob("*.ok")) == ["rank0.ok", "rank1.ok"]
