"""Transform 7: `.module` for the DDP-wrapped model's own methods, attributes and state_dict()."""

from ddpify.anatomy import DDP_WRAPPER
from ddpify.codemods.module_access import ModuleAccess


class DDPModuleAccess(ModuleAccess):
    """Methods, attributes and state_dict() of a DDP-wrapped model go through `.module`."""

    WRAPPER = DDP_WRAPPER
