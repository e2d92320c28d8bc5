"""Transform 4: `.module` for the DataParallel-wrapped model's own methods, attributes and state_dict()."""

from ddpify.anatomy import DP_WRAPPER
from ddpify.codemods.module_access import ModuleAccess


class DPModuleAccess(ModuleAccess):
    WRAPPER = DP_WRAPPER
