"""Does a model's forward work row by row: each output row computed from its input row alone?

Where the ranks share the rows of a whole batch (codemods/ddp/rows.py), such a forward can run on each
rank's rows only, and the ranks split the work of the forward and backward, not only the loss's.
Decided conservatively from the model's classes (this file's, or torch.nn layers built in place): every
layer they build is one known to work row by row (no BatchNorm, whose train-mode statistics span the
batch; no attention or graph layer; no Dropout, whose masks would be drawn for other rows), and every
operation their methods run is elementwise, works along a dimension other than the rows (a constant
`dim` other than 0), or sizes a tensor by the batch's rows (`x.size(0)`). Anything else (a product
`@`, an index into the rows, a function this file can't see) keeps the forward whole, with the reason.

Asked whether the rows are kept apart as samples (`samples=True`: may DataParallel split them over its
GPUs, as it splits a loader's batch?), BatchNorm and Dropout pass too: their statistics and masks are
drawn per batch, but no output row is computed from another row's input.
"""

from __future__ import annotations

import ast
import builtins
import re

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import ModelSite
from ddpify.anatomy.syntax import keyword
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.vocabulary import BATCHNORM, PARAMETER_CONSTRUCTOR, RECURRENT_LAYERS

# layers whose output row depends on its input row alone (their parameters aside)
ROW_WISE_LAYERS = re.compile(
    r"^torch\.nn\.(Sequential|ModuleList|Identity|Linear|Bilinear|Conv[123]d|ConvTranspose[123]d|LSTMCell|GRUCell|RNNCell|"
    r"Embedding|LayerNorm|GroupNorm|(Adaptive)?(Max|Avg)Pool[123]d|ReLU6?|LeakyReLU|PReLU|ELU|SELU|CELU|GELU|SiLU|"
    r"Mish|Tanh|Sigmoid|Softplus|Softsign|Hardtanh|Hardswish|Hardsigmoid|Tanhshrink|LogSigmoid)$")
# row by row along a `dim` other than 0; where no dim is given, whether their default is one
_ALONG_DIM_LAYERS = {"torch.nn.Softmax": False, "torch.nn.LogSoftmax": False, "torch.nn.Softmin": False, "torch.nn.Flatten": True}
# layers and operations that keep samples apart though they don't work row by row: batch statistics, dropout masks
SAMPLE_WISE_LAYERS = re.compile(rf"{BATCHNORM.pattern}|^torch\.nn\.(Alpha|FeatureAlpha)?Dropout[123]?d?$")
SAMPLE_WISE = frozenset({"batch_norm", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})
_CONTAINERS = re.compile(r"^torch\.nn\.(Sequential|ModuleList)$")  # row by row where the layers they hold are
# tensor operations that work element by element (or only read a size)
ELEMENTWISE = frozenset({
    "relu", "relu6", "tanh", "sigmoid", "exp", "log", "abs", "clamp", "clip", "sin", "cos", "pow", "sqrt", "rsqrt", "neg",
    "elu", "selu", "gelu", "silu", "mish", "leaky_relu", "softplus", "hardtanh", "logsigmoid", "square", "add", "sub",
    "mul", "div", "double", "float", "half", "to", "contiguous", "detach", "clone", "size", "dim", "zeros_like", "ones_like",
})
# operations along the dimensions they are given, at these argument places of the function (`torch.sum(x, 1)`; one
# less for the method, `x.sum(1)`): row by row where each of those dims is a constant other than 0 (the default mixes rows)
ALONG_DIMS = {
    "cat": (1,), "stack": (1,), "split": (2,), "chunk": (2,), "unsqueeze": (1,), "squeeze": (1,), "flatten": (1,),
    "softmax": (1,), "log_softmax": (1,), "sum": (1,), "mean": (1,), "max": (1,), "min": (1,), "prod": (1,),
    "amax": (1,), "amin": (1,), "argmax": (1,), "argmin": (1,), "logsumexp": (1,), "cumsum": (1,), "transpose": (1, 2),
}
ROWS_SIZED = frozenset({"zeros", "ones", "empty", "full", "view", "reshape"})  # a shape whose first size is the rows'
_TORCH, _NN, _MODULE = "torch.", "torch.nn.", "torch.nn.Module"
_CALLABLE_BUILTINS = frozenset({"range", "len", "isinstance", "super", "zip", "enumerate", "getattr", "hasattr"})
_LIST_METHODS = frozenset({"append", "extend", "__init__"})


def forward_mixes_rows(a: Anatomy, model_call: ast.Call, samples: bool = False) -> str | None:
    """Why the forward of `model_call` (`model(x)`) may compute an output row from other rows; None: it works
    row by row (or, with `samples`, keeps its rows apart as samples: BatchNorm and Dropout allowed)."""
    sites = [o for o in a.origins(model_call.func, ROLE_MODEL) if isinstance(o, ModelSite)]
    if not sites:
        return "the model is built where this file can't see its layers"
    return next((why for site in sites if (why := _site_mixes_rows(a, site, samples))), None)


def _site_mixes_rows(a: Anatomy, site: ModelSite, samples: bool) -> str | None:
    if site.class_name in a.model_classes:
        return _class_mixes_rows(a, site.class_name, set(), samples)
    if not isinstance(site.node, ast.Call) or not _builds_layer(site.class_name):
        return f"the model's class {site.class_name or '(unknown)'} is no layer known to work row by row, nor a class of this file"
    return _layers_mix_rows(a, site.node, samples)


def _class_mixes_rows(a: Anatomy, name: str, seen: set[str], samples: bool) -> str | None:
    """Why class `name` (of this file), its bases or the classes it builds may mix rows."""
    seen.add(name)
    node = a.model_classes[name].node
    unseen = next((b for b in node.bases if not _known_base(a, a.qualname(b) or "")), None)
    if unseen is not None:
        return f"{name} derives from {ast.unparse(unseen)}, which this file can't see work row by row"
    others = [q for q in (a.qualname(b) for b in node.bases) if q in a.model_classes]
    others += [q for c in ast.walk(node) if isinstance(c, ast.Call) and (q := a.qualname(c.func)) in a.model_classes]
    why = _layers_mix_rows(a, node, samples) or _operations_mix_rows(a, node, samples)
    return why or next((w for other in dict.fromkeys(others) if other not in seen and (w := _class_mixes_rows(a, other, seen, samples))), None)


def _known_base(a: Anatomy, qualname: str) -> bool:
    """`nn.Module`, a class of this file, or a layer known to work row by row (`class Layer(nn.Linear)`)."""
    return qualname == _MODULE or qualname in a.model_classes or bool(ROW_WISE_LAYERS.match(qualname))


def _layers_mix_rows(a: Anatomy, node: ast.AST, samples: bool) -> str | None:
    """Why a torch.nn layer built in `node` may mix rows."""
    for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
        layer = a.qualname(call.func) or ""
        if not _builds_layer(layer) or samples and SAMPLE_WISE_LAYERS.match(layer):
            continue
        if layer in RECURRENT_LAYERS and not _true(keyword(call, "batch_first")):
            return f"`{ast.unparse(call)}` (line {call.lineno}) takes its sequence's steps as rows (no batch_first=True)"
        if _CONTAINERS.match(layer) and not all(isinstance(arg, ast.Call) for arg in _held(call)):
            return f"`{ast.unparse(call)}` (line {call.lineno}) holds layers built where this file can't see them work row by row"
        if layer in _ALONG_DIM_LAYERS and not _other_dims(call, (0,), _ALONG_DIM_LAYERS[layer]):
            return f"`{ast.unparse(call)}` (line {call.lineno}) may work across rows (its dim is not a constant other than 0)"
        if not (ROW_WISE_LAYERS.match(layer) or layer in _ALONG_DIM_LAYERS or layer in RECURRENT_LAYERS):
            return f"`{ast.unparse(call)}` (line {call.lineno}) is no layer known to work row by row"
    return None


def _operations_mix_rows(a: Anatomy, cls: ast.ClassDef, samples: bool) -> str | None:
    """Why an operation in the methods of `cls` past its `__init__` may mix rows."""
    methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)]
    built = _built_attributes(a, cls) | {f.name for f in methods}
    for node in (n for f in methods if f.name != "__init__" for n in ast.walk(f)):
        why = _why_mixes(a, node, built, samples)
        if why:
            return f"`{ast.unparse(node)}` (line {node.lineno}) in {cls.name} {why}"  # type: ignore[attr-defined]
    return None


def _why_mixes(a: Anatomy, node: ast.AST, built: set[str], samples: bool) -> str | None:
    """Why this node of a model class may mix rows (None: it works row by row, or is no operation)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return "multiplies matrices"
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return "transposes the rows"
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and not keeps_all_rows(node.slice) and not _of_shape(node):
        return "indexes the rows (or an item of a result)"
    if isinstance(node, ast.Call):
        return _why_call_mixes(a, node, built, samples)
    return None


def _why_call_mixes(a: Anatomy, call: ast.Call, built: set[str], samples: bool) -> str | None:
    func = call.func
    qualname = a.qualname(func) or ""
    if _builds_layer(qualname):
        return None  # checked where built: _layers_mix_rows
    if isinstance(func, ast.Name) and not qualname.startswith(_TORCH):
        own = func.id in _CALLABLE_BUILTINS and hasattr(builtins, func.id) and func.id not in a.names.aliases
        return None if own or func.id in a.model_classes else "calls a function this file can't see work row by row"
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return None if func.attr in built else "calls a module this file can't see work row by row"
    on_tensor = not qualname.startswith(_TORCH)
    name = qualname.rpartition(".")[2] if not on_tensor else getattr(func, "attr", "")
    if name in ELEMENTWISE or name in _LIST_METHODS and on_tensor or samples and name in SAMPLE_WISE:
        return None
    if name in ALONG_DIMS:
        places = [p - on_tensor for p in ALONG_DIMS[name]]
        return None if _other_dims(call, places) else "works across the rows (no constant dim other than 0)"
    if name in ROWS_SIZED:
        shape = call.args[not on_tensor and name in ("view", "reshape"):]
        return None if shape and _sized_by_rows(shape[0]) else "makes a shape whose first size is not the batch's rows"
    if name == "permute" and call.args and _constant(call.args[0]) == 0:
        return None
    return "is no operation known to work row by row"


def _builds_layer(qualname: str) -> bool:
    """`torch.nn.Linear`, a layer's class (not `torch.nn.functional.relu`, nor a parameter: the operations decide)."""
    return qualname.startswith(_NN) and qualname[len(_NN):][:1].isupper() and qualname != PARAMETER_CONSTRUCTOR


def _built_attributes(a: Anatomy, cls: ast.ClassDef) -> set[str]:
    """The `self.name` the class assigns a torch.nn layer or a model of this file to (checked where built)."""
    return {t.attr for node in ast.walk(cls) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and (_builds_layer(q := a.qualname(node.value.func) or "") or q in a.model_classes)
            for t in node.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def _held(container: ast.Call) -> list[ast.expr]:
    """The layers `nn.Sequential(a, b)` or `nn.ModuleList([a, b])` holds, as written."""
    listed = [e for arg in container.args if isinstance(arg, (ast.List, ast.Tuple)) for e in arg.elts]
    return listed + [arg for arg in container.args if not isinstance(arg, (ast.List, ast.Tuple))]


def _other_dims(call: ast.Call, places: list[int] | tuple[int, ...], default: bool = False) -> bool:
    """Is every dim of `call` (at these argument places, or `dim=`/`start_dim=`) a constant other than 0? (`default`
    where none is given)"""
    named = [k.value for k in call.keywords if k.arg in ("dim", "dim0", "dim1", "start_dim")]
    dims = named or [call.args[p] for p in places if p < len(call.args)]
    if not dims:
        return default
    return all(isinstance(_constant(d), int) and _constant(d) != 0 for d in dims)


def _sized_by_rows(first: ast.expr | None) -> bool:
    """A shape whose first size is the batch's rows: `x.size(0)`, `x.shape[0]`, `len(x)` (-1 may fold other sizes in)."""
    if isinstance(first, (ast.Tuple, ast.List)) and first.elts:
        return _sized_by_rows(first.elts[0])
    if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "size":
        return len(first.args) == 1 and _constant(first.args[0]) == 0
    if isinstance(first, ast.Subscript) and isinstance(first.value, ast.Attribute) and first.value.attr == "shape":
        return _constant(first.slice) == 0
    return isinstance(first, ast.Call) and isinstance(first.func, ast.Name) and first.func.id == "len"


def keeps_all_rows(index: ast.expr) -> bool:
    """`x[:, 1]`, `x[..., :3]`: an index that keeps every row."""
    first = index.elts[0] if isinstance(index, ast.Tuple) and index.elts else index
    whole = isinstance(first, ast.Slice) and first.lower is None and first.upper is None and first.step is None
    return whole or isinstance(first, ast.Constant) and first.value is Ellipsis


def _of_shape(index: ast.Subscript) -> bool:
    """`x.shape[0]`: an item of a shape, no row."""
    return isinstance(index.value, ast.Attribute) and index.value.attr == "shape"


def _constant(node: ast.expr | None) -> object:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value  # type: ignore[operator]
    return node.value if isinstance(node, ast.Constant) else None


def _true(k: ast.keyword | None) -> bool:
    return k is not None and _constant(k.value) is True
