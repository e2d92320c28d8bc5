"""The anatomy of a training script, found once and read by every codemod and lint rule."""

from ddpify.anatomy.analyzer import analyze
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, LoaderSite, LoopSite, ModelSite, Pos, Ref, ScriptKind, Site
from ddpify.anatomy.tree import Function
from ddpify.anatomy.values import (
    ROLE_CRITERION,
    ROLE_LOADER,
    ROLE_LOGGER,
    ROLE_MODEL,
    ROLE_MODELS,
    ROLE_OPTIMIZER,
    ROLE_PBAR,
    ROLE_SCALER,
    ROLE_SCHEDULER,
    ROLE_WRITER,
    ModelClass,
)
from ddpify.anatomy.vocabulary import ADAPTIVE_OPTIMIZERS, DDP_WRAPPER, DISTRIBUTING_FRAMEWORKS, DP_WRAPPER, LOG_METHODS

__all__ = [
    "ADAPTIVE_OPTIMIZERS", "DDP_WRAPPER", "DISTRIBUTING_FRAMEWORKS", "DP_WRAPPER", "LOG_METHODS", "MODULE_SCOPE",
    "ROLE_CRITERION", "ROLE_LOADER", "ROLE_LOGGER", "ROLE_MODEL", "ROLE_MODELS", "ROLE_OPTIMIZER", "ROLE_PBAR",
    "ROLE_SCALER", "ROLE_SCHEDULER", "ROLE_WRITER",
    "Anatomy", "CallSite", "Function", "LoaderSite", "LoopSite", "ModelClass", "ModelSite", "Pos",
    "Ref", "ScriptKind", "Site", "analyze",
]
