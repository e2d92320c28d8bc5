"""DP002: module state changed inside the `forward` of a DataParallel-wrapped model."""

from __future__ import annotations

from ddpify.anatomy.forward import state_mutations
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._dp import HEAD, dp_replica_forwards


class StateInForward(Rule, code="DP002", name="state-in-forward", severity="warning"):
    """## What it does
    Flags changes to the module's own state inside the `forward` of a model wrapped in
    `nn.DataParallel` (or in the methods `forward` calls): `self.calls += 1`, `self.cache = out`,
    `self.history.append(loss)`, `self.count.add_(1)`.

    ## Why is this bad?
    For every call DataParallel copies the model onto each GPU and runs `forward` on the copies,
    which are discarded afterwards. Attributes set on a copy are lost, so counters stay at their
    initial value and caches stay empty. In-place changes to a shared list or dict happen from
    several threads at once. Only in-place updates of parameters and buffers on the first GPU reach
    the original module. On CPU, or with a single GPU, the code seems to work.

    ## Example
    ```python
    def forward(self, x):
        self.steps += 1
        return self.fc(x)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        return self.fc(x)

    for x, y in loader:
        steps += 1  # keep such state in the training loop
        loss = criterion(model(x), y)
    ```

    ## Fix safety
    No fix: where the state should live instead depends on what it is for.
    """

    message = "forward() changes the module's state: under DataParallel it runs on per-GPU copies that are discarded, so the change is lost"

    def check(self, anatomy):
        for forward in dp_replica_forwards(anatomy):
            for mutation in state_mutations(anatomy, forward):
                yield Finding(anatomy.pos(mutation))


_COUNTING = HEAD.replace("        self.fc = nn.Linear(4, 2)\n", "        self.fc = nn.Linear(4, 2)\n        self.calls = 0\n")
_WRAP = "model = nn.DataParallel(Net())\n"

StateInForward.VALID = (
    HEAD + _WRAP,
    # a local variable, and state changed outside forward
    HEAD.replace("        return self.fc(x)\n", "        calls = 1\n        return self.fc(x) * calls\n") + _WRAP + "model.module.fc.weight.data.zero_()\n",
)
StateInForward.INVALID = (
    Invalid(_COUNTING.replace("        return self.fc(x)\n", "        self.calls += 1\n        return self.fc(x)\n") + _WRAP, line=12),
    Invalid(
        _COUNTING.replace("        return self.fc(x)\n", "        out = self.fc(x)\n        self.remember(out)\n        return out\n\n"
                          "    def remember(self, out):\n        self.last = out.detach()\n") + _WRAP,
        line=17,
    ),
)
