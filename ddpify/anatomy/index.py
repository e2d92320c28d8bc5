"""The index pass of the analysis: which classes of the script are models, every call site, and a
site for each DataLoader and model a call builds (the values the value flow then carries)."""

from __future__ import annotations

import ast

from ddpify.anatomy.sites import CallSite, LoaderSite, ModelSite
from ddpify.anatomy.values import ROLE_LOADER, ModelClass, ScriptValues
from ddpify.anatomy.vocabulary import BATCHNORM, BLOCK_SEQUENCES, PARAMETER_CONSTRUCTOR


def build_index(anatomy: ScriptValues) -> None:
    """Fill the anatomy's model classes, calls, and loader and model sites."""
    _Indexer(anatomy).run()


class _Indexer:
    """The model classes, and the interesting calls."""

    def __init__(self, anatomy: ScriptValues) -> None:
        self.a = anatomy

    def run(self) -> None:
        a = self.a
        self._collect_classes()
        for node in a.nodes_of(ast.Call):
            self._record_call(node)  # type: ignore[arg-type]

    def _collect_classes(self) -> None:
        a = self.a
        classes = {n.name: n for n in a.tree.body if isinstance(n, ast.ClassDef)}
        changed = True
        while changed:
            changed = False
            for name, node in classes.items():
                if name in a.model_classes:
                    continue
                bases = {a.qualname(b) for b in node.bases}
                if "torch.nn.Module" in bases or bases & set(a.model_classes) or any(_imported_model_class(a, b) for b in bases):
                    a.model_classes[name] = _describe_model_class(a, node)
                    changed = True
        for mc in a.model_classes.values():  # inherited batchnorm
            for base in (a.qualname(b) for b in mc.node.bases):
                if base in a.model_classes and a.model_classes[base].has_batchnorm:
                    mc.has_batchnorm = True
                if _imported_model_class(a, base) and a.facts.imported[base].has_batchnorm:  # type: ignore[index]
                    mc.has_batchnorm = True

    def _record_call(self, call: ast.Call) -> None:
        a = self.a
        q = a.qualname(call.func) or ""
        if isinstance(call.func, ast.Name) and call.func.id in a.functions:
            q = call.func.id
        site = a.site(call, CallSite, qualname=q)
        a.calls.append(site)  # type: ignore[arg-type]
        if q == "torch.utils.data.DataLoader" or a.facts.returns(q, ROLE_LOADER):
            built_elsewhere = q != "torch.utils.data.DataLoader"
            loader = a.site(call, LoaderSite, call=call, built_elsewhere=built_elsewhere)
            a.loader_sites[call] = loader  # type: ignore[assignment]
            (a.foreign_loaders if built_elsewhere else a.loaders).append(loader)  # type: ignore[arg-type]
        elif a.is_model_constructor(q):
            mc = a.model_classes.get(q)
            imported = a.facts.imported.get(q)
            has_batchnorm = mc.has_batchnorm if mc else imported.has_batchnorm if imported else None
            model = a.site(call, ModelSite, class_name=q, has_batchnorm=has_batchnorm)
            if mc is None and q.startswith("torch.nn."):
                model.has_batchnorm = any(  # type: ignore[attr-defined]
                    isinstance(n, ast.Call) and bool(BATCHNORM.match(a.qualname(n.func) or "")) for n in ast.walk(call)
                )
            a.model_sites[call] = model  # type: ignore[assignment]
        self._record_returned_loaders(call, q)

    def _record_returned_loaders(self, call: ast.Call, q: str) -> None:
        """A stand-in site for each loader in the tuple that a function of another file returns."""
        a = self.a
        exported = a.facts.imported.get(q)
        for index, roles in enumerate(exported.items if exported else ()):
            if ROLE_LOADER in roles:
                loader = a.site(call, LoaderSite, call=call, built_elsewhere=True, index=index)
                a.item_sites[(call, index)] = loader  # type: ignore[assignment]
                a.foreign_loaders.append(loader)  # type: ignore[arg-type]


def _imported_model_class(a: ScriptValues, qualname: str | None) -> bool:
    imported = a.facts.imported.get(qualname or "")
    return imported is not None and imported.is_model_class


def _describe_model_class(a: ScriptValues, node: ast.ClassDef) -> ModelClass:
    mc = ModelClass(node=node, name=node.name)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mc.methods.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            mc.attributes.update(t.id for t in targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" and isinstance(sub.ctx, ast.Store):
            mc.attributes.add(sub.attr)
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call) and a.qualname(sub.value.func) == PARAMETER_CONSTRUCTOR:
            mc.parameters.update(t.attr for t in sub.targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self")
        if isinstance(sub, ast.Assign) and _is_repeated_blocks(a, sub.value):
            mc.block_lists += [t.attr for t in sub.targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"]
        if isinstance(sub, ast.Call) and BATCHNORM.match(a.qualname(sub.func) or ""):
            mc.has_batchnorm = True
    return mc


def _is_repeated_blocks(a: ScriptValues, value: ast.expr) -> bool:
    """`nn.ModuleList`/`nn.Sequential` of blocks built by a comprehension or of one repeated class:
    the units FSDP shards one by one."""
    if not (isinstance(value, ast.Call) and a.qualname(value.func) in BLOCK_SEQUENCES):
        return False
    items = [arg.value if isinstance(arg, ast.Starred) else arg for arg in value.args]
    if len(items) == 1 and isinstance(items[0], (ast.ListComp, ast.GeneratorExp)):
        return True
    elements = items[0].elts if len(items) == 1 and isinstance(items[0], (ast.List, ast.Tuple)) else items
    classes = {a.qualname(e.func) for e in elements if isinstance(e, ast.Call)}
    return len(elements) >= 2 and len(classes) == 1 and all(isinstance(e, ast.Call) for e in elements)
