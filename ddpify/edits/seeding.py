"""The seeding helper convert inserts before an FSDP model is built (`codemods.fsdp.seeds`) and the
seed rules' fix inserts too (`rules/_seeds.py`): one spelling of it for both."""

from __future__ import annotations

from ddpify.anatomy.distributed.names import PYTHON

SEED_HELPER = "seed_everything"
SEED_CALL = f"{SEED_HELPER}(0)\n"


def seed_helper(torch: str, numpy: str | None) -> str:
    """The helper's definition, after two blank lines, with torch and numpy spelled as the script
    imports them (a script without numpy draws nothing from it: it is not seeded)."""
    numpy_seed = f"    {numpy}.random.seed(seed)\n" if numpy else ""
    return (f"\n\ndef {SEED_HELPER}(seed):\n"
            '    """Seed every random number generator alike on every rank."""\n'
            f"    {PYTHON}.seed(seed)\n{numpy_seed}"
            f"    {torch}.manual_seed(seed)\n"
            f"    {torch}.cuda.manual_seed_all(seed)\n")
