"""Transform 4: `.module` for the DataParallel-wrapped model's own methods, attributes and state_dict()."""

from ddpify.anatomy import DP_WRAPPER
from ddpify.codemods.module_access import ModuleAccess


class DPModuleAccess(ModuleAccess):
    """Methods, attributes and state_dict() of a DataParallel-wrapped model go through `.module`."""

    WRAPPER = DP_WRAPPER
