"""The anatomy of a training script, found once and read by every codemod and lint rule."""

from ddpify.anatomy.analyzer import (
    DDP_WRAPPER,
    DP_WRAPPER,
    LOG_METHODS,
    ROLE_CRITERION,
    ROLE_LOADER,
    ROLE_LOGGER,
    ROLE_MODEL,
    ROLE_OPTIMIZER,
    ROLE_PBAR,
    ROLE_SCALER,
    ROLE_SCHEDULER,
    ROLE_WRITER,
    Anatomy,
    Function,
    ModelClass,
    analyze,
)
from ddpify.anatomy.sites import (
    MODULE_SCOPE,
    CallSite,
    LoaderSite,
    LoopSite,
    ModelSite,
    Pos,
    Ref,
    ScriptKind,
    Site,
)

__all__ = [
    "DDP_WRAPPER", "DP_WRAPPER", "LOG_METHODS", "MODULE_SCOPE",
    "ROLE_CRITERION", "ROLE_LOADER", "ROLE_LOGGER", "ROLE_MODEL", "ROLE_OPTIMIZER", "ROLE_PBAR",
    "ROLE_SCALER", "ROLE_SCHEDULER", "ROLE_WRITER",
    "Anatomy", "CallSite", "Function", "LoaderSite", "LoopSite", "ModelClass", "ModelSite", "Pos",
    "Ref", "ScriptKind", "Site", "analyze",
]
