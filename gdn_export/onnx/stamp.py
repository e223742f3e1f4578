"""The stamped export: trace one decoder layer of each kind, copy its subgraph for every layer.

Tracing costs ~1 s a decoder layer on a 2-core CPU, and a model's layers come in a few kinds
(gdn_export.onnx.kinds). `export_onnx` therefore traces a *reduced* model holding the first layer of
each kind (the representatives, in model order) and builds the whole graph from it:

    1. the exporter's graph of the reduced model before its optimizer (run_exporter optimize=False)
    2. `optimize_layers`: the optimizer passes that act within a layer (constant folding, the
       rewrite rules, lifting constants to initializers: onnxscript's optimize_ir up to its
       initializer deduplication); a `FoldLog` notes each node the folding turns into an initializer
    3. `canonical_dim_sources`: every dynamic dim read from a graph input is read from the first
       input that has it (the exporter picks one by rules of its own: the batch size of a 4-layer
       model from past.3.value, of a 2-layer one from past.0.conv)
    4. `Template.build`: the graph split into the skeleton (the embedding and the step inputs before
       the layers, the final norm and lm_head after them) and one subgraph per representative;
       every initializer named by its role: a weight (by its module path), a weight transformed by
       the folding (its *recipe*, the folded nodes), or a constant of the graph
    5. `Template.instantiate`: the skeleton once and, for layer i of kind k, representative k's
       subgraph with its values renamed for layer i, its state inputs / outputs past.{i}.* /
       present.{i}.*, its input the output of layer i - 1, and its initializers made from layer i's
       own tensors: the weights as onnx_ir tensors over the torch tensors (no copy), the recipes
       evaluated as the folding evaluated them (onnx's reference ops; a transpose stays a view)
    6. `optimize_across_layers`: the optimizer passes that act across layers (deduplicating small
       equal initializers, common subexpressions: e.g. the masks every attention layer computes
       alike are computed once), so the result is the graph a trace of the whole model gives
       (tests/onnx/test_stamp.py compares them node for node and their outputs under ONNX Runtime).

Anything the template cannot express raises StampError with the reason; export_onnx then traces the
whole model. The template holds no weights: gdn_export.onnx.trace_cache keeps it on disk.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

# The onnxscript release whose optimizer `optimize_layers` + `optimize_across_layers` replay.
CHECKED_ONNXSCRIPT = ("0.7.",)
LAYER_KEY = "gdn_export.stamp.layer"  # node metadata in a template: the representative's position
ROLE_KEY = "gdn_export.stamp.role"  # initializer metadata in a template: "param" | "recipe" | "const"
OWNER_KEY = "gdn_export.stamp.owner"  # initializer metadata: the layer position that owns it ("" skeleton)
EMBED_KEY = "gdn_export.stamp.embedding"  # initializer metadata: "1" on the token embedding's weight
SCALAR_KEY = "gdn_export.stamp.scalar"  # initializer metadata: a one-element weight's scalar class
EMBEDDING = "model.embed_tokens.weight"
_SCOPES = "pkg.torch.onnx.name_scopes"
_LAYER_SCOPE = re.compile(r"^model\.layers\.(\d+)(?:\.|$)")
PARAM, RECIPE, CONST = "param", "recipe", "const"


class StampError(Exception):
    """The stamped export cannot build this model's graph (the message says why); export_onnx traces
    the whole model instead."""


def check_optimizer() -> None:
    """StampError unless the installed onnxscript is the release whose optimizer the stamped export
    replays."""
    import onnxscript

    if not onnxscript.__version__.startswith(CHECKED_ONNXSCRIPT):
        raise StampError(f"onnxscript {onnxscript.__version__}: the stamped export replays the optimizer of "
                         f"onnxscript {' / '.join(v + 'x' for v in CHECKED_ONNXSCRIPT)}")


# ---------------------------------------------------------------------------- optimizer, split
def optimize_layers(model: ir.Model, log: FoldLog | None = None) -> None:
    """The passes of onnxscript's optimize (optimize_ir) that act within a layer, in place: inline,
    constant folding and the default rewrite rules (twice at most), unused nodes, constants lifted
    to initializers. `log` notes what the folding computes."""
    from onnx_ir.passes import common
    from onnxscript import rewriter

    ir.passes.Sequential(
        common.InlinePass(),
        ir.passes.PassManager(
            [_folding_pass(log),
             rewriter.RewritePass(rewriter._DEFAULT_REWRITE_RULES),
             common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass()],
            steps=2, early_stop=True),
        common.RemoveUnusedNodesPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
    )(model)


def optimize_across_layers(model: ir.Model) -> None:
    """The rest of onnxscript's optimize, in place: equal small initializers deduplicated, common
    subexpressions eliminated, outputs and names fixed, then its ONNX fusions."""
    from onnx_ir.passes import common
    from onnxscript.rewriter import onnx_fusions

    ir.passes.Sequential(
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    )(model)
    onnx_fusions.fuse(model)


def eliminate_common_subexpressions(model: ir.Model) -> None:
    """onnx_ir's common-subexpression pass, in place (after `canonical_dim_sources` on an optimized
    graph: the Shape nodes it made alike become one)."""
    from onnx_ir.passes import common

    common.CommonSubexpressionEliminationPass()(model)


def dim_source(node: ir.Node, inputs) -> ir.Value | None:
    """For a Shape node over a graph input that reads symbolic dims only: the first of `inputs`
    with the same dim names at the same positions. None for any other node."""
    if node.op_type != "Shape" or node.domain != "" or not node.inputs or not node.inputs[0].is_graph_input():
        return None
    src = node.inputs[0]
    if src.shape is None:
        return None
    rank = len(src.shape)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else min(end, rank))
    names = [src.shape[d].value if isinstance(src.shape[d], ir.SymbolicDim) else None for d in range(start, end)]
    if not names or None in names:
        return None
    for candidate in inputs:
        if candidate.shape is not None and len(candidate.shape) >= end and all(
                isinstance(candidate.shape[d], ir.SymbolicDim) and candidate.shape[d].value == n
                for d, n in zip(range(start, end), names)):
            return candidate
    return None


def canonical_dim_sources(model: ir.Model) -> int:
    """Read every dynamic dim from the first graph input that has it, in place: each Shape node
    over a graph input whose read dims are all symbolic moves to the first input with the same dim
    names at the same positions. Returns how many moved."""
    inputs = list(model.graph.inputs)
    moved = 0
    for node in model.graph:
        source = dim_source(node, inputs)
        if source is not None and source is not node.inputs[0]:
            node.replace_input_with(0, source)
            moved += 1
    return moved


# ---------------------------------------------------------------------------- raw constants
def _scope_layer(node: ir.Node) -> int | None:
    """The decoder layer (position in the traced model) a node comes from, None for the skeleton."""
    raw = node.metadata_props.get(_SCOPES)
    if not raw:
        return None
    scopes = ast.literal_eval(raw)
    for s in scopes[1:2]:
        m = _LAYER_SCOPE.match(s)
        if m:
            return int(m.group(1))
    return None


@dataclass
class _ConeNode:
    """A node computing a constant: what the folding evaluated (inputs and outputs by name)."""

    domain: str
    op_type: str
    attributes: list
    inputs: list[str | None]
    outputs: list[str]


class FoldLog:
    """Every node onnxscript's constant folding turns into an initializer, in the order it does,
    with the constants it read: `recipe(name)` gives the nodes that compute a folded initializer
    from the weights, and the weights and other constants they read."""

    def __init__(self) -> None:
        self.folds: dict[str, _ConeNode] = {}
        self.read: dict[str, object] = {}  # constants read by a fold, by name: their tensors then

    def note(self, node: ir.Node, output: ir.Value) -> None:
        for v in node.inputs:
            if v is not None and v.name not in self.folds:
                self.read.setdefault(v.name, v.const_value)
        self.folds[output.name] = _ConeNode(node.domain, node.op_type, list(node.attributes.values()),
                                            [None if v is None else v.name for v in node.inputs], [output.name])

    def recipe(self, name: str) -> tuple[list[_ConeNode], set[str]] | None:
        """(the fold nodes computing `name`, in order; the names of the non-folded constants they
        read), or None when the folding did not make `name`."""
        if name not in self.folds:
            return None
        order, leaves, seen = [], set(), set()

        def visit(v: str) -> None:
            if v in seen:
                return
            seen.add(v)
            node = self.folds.get(v)
            if node is None:
                leaves.add(v)
                return
            for i in node.inputs:
                if i is not None:
                    visit(i)
            order.append(node)

        visit(name)
        return order, leaves


def _folding_pass(log: FoldLog | None):
    """onnxscript's FoldConstantsPass with the optimizer's settings, noting its folds into `log`."""
    from onnxscript.optimizer import _constant_folding as cf

    class Noting(cf.FoldConstantsPass):
        def new_initializer(self, node, array):
            value = super().new_initializer(node, array)
            if value is not None and log is not None:
                log.note(node, value)
            return value

    return Noting(shape_inference=True, input_size_limit=cf.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                  output_size_limit=cf.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT, should_fold=lambda node: None)


# ---------------------------------------------------------------------------- recipe evaluation
def _numpy(tensor) -> np.ndarray:
    """A tensor's array as onnxscript's folding reads it (viewed as its ONNX dtype)."""
    array = tensor.numpy()
    if tensor.dtype != ir.DataType.STRING:
        array = array.view(tensor.dtype.numpy())
    return array


def _constant_array(node: _ConeNode) -> np.ndarray:
    """The value of a Constant node, as onnxscript's folding reads it."""
    (attr,) = node.attributes
    if attr.name in ("value_float", "value_floats"):
        return np.array(attr.value, dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.array(attr.value, dtype=np.int64)
    if attr.name == "value":
        return _numpy(attr.value)
    raise StampError(f"a folded weight reads a Constant node with attribute {attr.name!r}")


def evaluate(nodes: list[_ConeNode], leaves: dict[str, np.ndarray], opsets: dict[str, int],
             ops: dict | None = None) -> dict[str, np.ndarray]:
    """Run cone `nodes` on the initializer arrays `leaves` with onnx's reference ops, as onnxscript's
    constant folding does. Returns every computed value by name. `ops` keeps the ops made for the
    nodes (by node) from call to call."""
    import onnx.reference.ops

    ops = {} if ops is None else ops
    values = dict(leaves)
    for node in nodes:
        if node.op_type == "Constant" and node.domain == "":
            values[node.outputs[0]] = _constant_array(node)
            continue
        if len(node.outputs) != 1:
            raise StampError(f"a folded weight passes through {node.op_type}, which has several outputs")
        inputs = [None if i is None else values[i] for i in node.inputs]
        op = ops.get(id(node))
        if op is None:
            attrs = {a.name: ir.serde.serialize_tensor(a.value) if a.type == ir.AttributeType.TENSOR else a.value
                     for a in node.attributes}
            impl = onnx.reference.ops.load_op(node.domain, node.op_type, opsets[node.domain])
            op = ops[id(node)] = impl.create(len(inputs), **attrs)  # what OpRun.eval makes for each call
        out = op.run(*inputs)
        values[node.outputs[0]] = out[0] if len(out) == 1 else out
    return values


# ---------------------------------------------------------------------------- the template
_LAYER_IN_TEXT = r"(?<![\w.])(model[._]layers[._]){j}(?=[._'\]:/ ]|$)"


def _renamer(j: int, i: int):
    """A function renaming the layer-j references of a metadata string / module path to layer i."""
    pattern = re.compile(_LAYER_IN_TEXT.format(j=j))
    index = str(i)
    return lambda text: pattern.sub(lambda m: m.group(1) + index, text) if "layers" in text else text


def _state_rename(name: str, j: int, i: int) -> str:
    for prefix in ("past.", "present."):
        if name.startswith(f"{prefix}{j}."):
            return f"{prefix}{i}.{name[len(prefix) + len(str(j)) + 1:]}"
    return name


@dataclass
class _Layer:
    """One representative's subgraph: its nodes in order, the stream value it reads (the previous
    layer's output or the embedding) and the one it writes."""

    nodes: list = field(default_factory=list)
    stream_in: ir.Value | None = None
    stream_out: ir.Value | None = None


class Template:
    """The reduced model's optimized graph, split into skeleton and representative subgraphs, with
    every initializer's role; built by `build` (from a trace) or `from_proto` (from the cache)."""

    def __init__(self, model: ir.Model, recipes: ir.Graph | ir.Function) -> None:
        """model: the reduced model's graph with LAYER_KEY on layer nodes and ROLE_KEY / OWNER_KEY on
        initializers (PARAM and RECIPE ones need no data); recipes: the folding nodes computing each
        RECIPE initializer (its outputs) from the weights its inputs name."""
        self.model, self.recipes = model, recipes
        self._recipe_plans: dict[tuple, list[_ConeNode]] = {}  # recipe nodes by the outputs asked for
        self._recipe_ops: dict[int, object] = {}  # their reference ops
        self._split()

    # -------------------------------------------------------------- structure
    def _split(self) -> None:
        g = self.model.graph
        self.prefix, self.tail, self.layers = [], [], []
        owner: dict[int, int | None] = {}
        for node in g:
            tag = node.metadata_props.get(LAYER_KEY)
            j = int(tag) if tag else None
            if j is None:
                (self.tail if self.layers else self.prefix).append(node)
            else:
                if self.tail or j < len(self.layers) - 1 or j > len(self.layers):
                    raise StampError(f"node {node.name} of layer {j} is not in layer order (the graph "
                                     "interleaves the layers and the skeleton)")
                if j == len(self.layers):
                    self.layers.append(_Layer())
                self.layers[j].nodes.append(node)
            for v in node.outputs:
                owner[id(v)] = j
        self._owner = owner
        self.inputs = {v.name: v for v in g.inputs}
        self.token_inputs = [v for v in g.inputs if not v.name.startswith("past.")]
        self._stream_links()

    def _layer_of_value(self, v: ir.Value) -> int | None | str:
        """The layer position owning v, None for a skeleton value, "input" / "init" for graph inputs
        and initializers."""
        if v.is_graph_input():
            return "input"
        if v.is_initializer():
            return "init"
        return self._owner.get(id(v), None)

    def _stream_links(self) -> None:
        """Find each layer's stream input and output, and check that nothing else crosses a
        layer's border."""
        g = self.model.graph
        embed = [n for n in self.prefix if any(v is not None and v.is_initializer()
                                                and v.metadata_props.get(EMBED_KEY) for v in n.inputs)]
        if len(embed) != 1:
            raise StampError(f"the skeleton reads the embedding in {len(embed)} nodes")
        tainted = {id(v) for v in embed[0].outputs}
        for node in self.prefix:
            if any(v is not None and id(v) in tainted for v in node.inputs):
                tainted.update(id(v) for v in node.outputs)
        prefix_values = {id(v) for n in self.prefix for v in n.outputs}
        for j, layer in enumerate(self.layers):
            streams = set()
            for node in layer.nodes:
                for v in node.inputs:
                    if v is None:
                        continue
                    where = self._layer_of_value(v)
                    if where == "input":
                        if v not in self.token_inputs and not v.name.startswith(f"past.{j}."):
                            raise StampError(f"layer {j} reads graph input {v.name}")
                    elif where == "init":
                        o = v.metadata_props.get(OWNER_KEY, "")
                        if o not in ("", str(j)):
                            raise StampError(f"layer {j} reads initializer {v.name} of layer {o}")
                    elif where == j:
                        continue
                    elif where is None and id(v) in prefix_values:
                        if id(v) in tainted:
                            streams.add(v)
                    elif where == j - 1:
                        streams.add(v)
                    else:
                        place = "the skeleton after the layers" if where is None else f"layer {where}"
                        raise StampError(f"layer {j} reads {v.name} of {place}")
            if len(streams) != 1:
                raise StampError(f"layer {j} reads {len(streams)} values of the layer before it "
                                 f"({', '.join(sorted(str(v.name) for v in streams))}), one expected")
            (layer.stream_in,) = streams
            if (j == 0) != (id(layer.stream_in) in prefix_values):
                raise StampError(f"layer {j} reads {layer.stream_in.name} as its input")
            if j:
                self.layers[j - 1].stream_out = layer.stream_in
        last = len(self.layers) - 1
        tail_reads = {v for n in self.tail for v in n.inputs
                      if v is not None and self._layer_of_value(v) not in ("input", "init", None)}
        if len(tail_reads) != 1 or self._layer_of_value(next(iter(tail_reads))) != last:
            raise StampError(f"the skeleton after the layers reads {sorted(str(v.name) for v in tail_reads)}: "
                             f"one value of the last layer expected")
        self.layers[last].stream_out = next(iter(tail_reads))
        for node in self.prefix + self.tail:
            for v in node.inputs:
                if v is not None and v.is_graph_input() and v not in self.token_inputs \
                        and dim_source(node, g.inputs) is not v:
                    raise StampError(f"the skeleton reads state input {v.name}")
        for out in g.outputs:
            where = self._layer_of_value(out)
            if where in ("input", "init"):
                raise StampError(f"graph output {out.name} is a graph input or initializer")
            if where is not None and not out.name.startswith(f"present.{where}."):
                raise StampError(f"graph output {out.name} comes from layer {where}")
        for v in g.initializers.values():
            if v.metadata_props.get(ROLE_KEY) not in (PARAM, RECIPE, CONST):
                raise StampError(f"initializer {v.name} has no role")

    # -------------------------------------------------------------- build from a trace
    @classmethod
    def build(cls, model: ir.Model, folds: FoldLog, tensors: dict) -> "Template":
        """The template of a reduced model's graph `model` (after optimize_layers, whose folds `folds`
        noted, and canonical_dim_sources; layers named model.layers.{j}); `tensors` {name: torch
        tensor} of the reduced model's parameters and buffers.
        Checks that the recipes give the folded values bit for bit."""
        g = model.graph
        for node in g:
            if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
                raise StampError(f"node {node.name} ({node.op_type}) holds a subgraph")
            if node.metadata_props.get(_SCOPES) is not None:
                j = _scope_layer(node)
            else:  # made by the optimizer's rewrites: the layer of what it reads
                j = _read_layer(node)
            if j is not None:
                node.metadata_props[LAYER_KEY] = str(j)
        recipe_nodes: list[_ConeNode] = []
        recipe_outputs: list[str] = []
        seen_cone: set[int] = set()
        for name, v in g.initializers.items():
            uses = {int(n.metadata_props[LAYER_KEY]) if LAYER_KEY in n.metadata_props else None
                    for n, _ in v.uses()}
            if name in tensors:
                v.metadata_props[ROLE_KEY] = PARAM
                v.metadata_props[OWNER_KEY] = _owner_of(name)
                if tensors[name] is tensors.get(EMBEDDING):  # by any of its names (tied to lm_head)
                    v.metadata_props[EMBED_KEY] = "1"
                continue
            recipe = folds.recipe(name)
            from_weights = recipe is not None and any(leaf in tensors for leaf in recipe[1])
            if not from_weights:  # a constant of the graph (shapes of weights at most: the kind fixes them)
                # One used by one layer alone is that layer's (each layer of its kind gets a copy, as
                # each layer's folding or translation makes its own); one used by several layers or
                # the skeleton is the exporter's one value for a Python constant, which every use shares.
                v.metadata_props[ROLE_KEY] = CONST
                v.metadata_props[OWNER_KEY] = str(next(iter(uses))) if len(uses) == 1 and None not in uses else ""
                continue
            nodes, leaves = recipe
            owners = {_owner_of(leaf) for leaf in leaves if leaf in tensors}
            if len(owners) != 1:
                raise StampError(f"initializer {name} is folded from weights of several layers")
            (owner,) = owners
            consumers = {str(u) if u is not None else "" for u in uses}
            if consumers - {owner}:
                raise StampError(f"initializer {name}, folded from layer {owner or 'skeleton'} weights, is used "
                                 f"by {sorted(consumers)}")
            v.metadata_props[ROLE_KEY] = RECIPE
            v.metadata_props[OWNER_KEY] = owner
            for node in nodes:
                if id(node) not in seen_cone:
                    seen_cone.add(id(node))
                    recipe_nodes.append(node)
            recipe_outputs.append(name)
        recipes = _recipe_graph(recipe_nodes, recipe_outputs, model, folds, tensors)
        for v in g.initializers.values():  # what the optimizer's no-op rules saw in the representative
            if v.metadata_props[ROLE_KEY] != CONST and v.const_value is not None and v.const_value.size == 1:
                v.metadata_props[SCALAR_KEY] = _scalar_class_of(_numpy(v.const_value))
        template = cls(model, recipes)
        template._check_recipes(tensors)
        return template

    def _check_recipes(self, tensors: dict) -> None:
        """StampError unless the recipes, run on the traced layers' tensors, give the folded
        initializers bit for bit."""
        got = self._run_recipes({name: tensors[name] for name in (v.name for v in self.recipes.inputs)},
                                [v.name for v in self.recipes.outputs])
        for name, array in got.items():
            want = _numpy(self.model.graph.initializers[name].const_value)
            if array.dtype != want.dtype or array.shape != want.shape or not np.array_equal(
                    _bits(array), _bits(want)):
                raise StampError(f"folding {name} again from the weights gives other values than the exporter")

    def _run_recipes(self, tensors: dict, outputs: list[str]) -> dict[str, np.ndarray]:
        """The recipe outputs `outputs` computed from torch tensors {recipe input name: tensor}."""
        from onnx_ir.tensor_adapters import TorchTensor

        key = tuple(outputs)
        if key not in self._recipe_plans:
            self._recipe_plans[key] = [_ConeNode(n.domain, n.op_type, list(n.attributes.values()),
                                                 [None if v is None else v.name for v in n.inputs],
                                                 [v.name for v in n.outputs])
                                       for n in self._recipe_nodes_for(outputs)]
        leaves = {name: _numpy(TorchTensor(t)) for name, t in tensors.items()}
        values = evaluate(self._recipe_plans[key], leaves, dict(self.model.opset_imports), self._recipe_ops)
        return {name: values[name] for name in outputs}

    def _recipe_nodes_for(self, outputs: list[str]) -> list[ir.Node]:
        want = set(outputs)
        nodes = list(self.recipes)
        needed = set()
        for node in reversed(nodes):
            if any(v.name in want for v in node.outputs):
                needed.add(id(node))
                want.update(v.name for v in node.inputs if v is not None)
        return [n for n in nodes if id(n) in needed]

    # -------------------------------------------------------------- persistence
    RECIPES = ("gdn_export.stamp", "recipes", "")

    def to_proto(self):
        """The template as an onnx.ModelProto without weights: PARAM and RECIPE initializers hold
        empty tensors, the recipes are the local function gdn_export.stamp.recipes."""
        g = self.model.graph
        slots = [v for v in g.initializers.values() if v.metadata_props[ROLE_KEY] != CONST]
        kept = [v.const_value for v in slots]
        try:
            for v in slots:
                v.const_value = ir.Tensor(np.zeros(0, dtype=np.uint8))
            fn = ir.Function(*self.RECIPES, graph=self.recipes if isinstance(self.recipes, ir.Graph)
                             else self.recipes.graph, attributes=[])
            model = ir.Model(g, ir_version=self.model.ir_version, producer_name="gdn-export stamp template",
                             functions=[fn])
            model.opset_imports[self.RECIPES[0]] = 1
            return ir.serde.serialize_model(model)
        finally:
            for v, t in zip(slots, kept):
                v.const_value = t
            g.opset_imports.pop(self.RECIPES[0], None)

    @classmethod
    def from_proto(cls, proto) -> "Template":
        """The template `to_proto` wrote; StampError when `proto` is not one."""
        model = ir.serde.deserialize_model(proto)
        fn = model.functions.get(cls.RECIPES)
        if fn is None:
            raise StampError("not a stamp template (no recipes)")
        model.functions.clear()
        model.opset_imports.pop(cls.RECIPES[0], None)
        return cls(model, fn)

    # -------------------------------------------------------------- instantiate
    def instantiate(self, model, kind_of: list[int]) -> ir.Model:
        """The graph of `model` (HybridForCausalLM; its layer i of kind kind_of[i], a position in the
        template) from this template and the model's own tensors; optimize_across_layers not yet
        run."""
        from onnx_ir.tensor_adapters import TorchTensor

        if len(kind_of) == 0 or max(kind_of) >= len(self.layers):
            raise StampError(f"the template has {len(self.layers)} layer kinds, the model's layers use {kind_of}")
        tensors = dict(model.named_parameters(remove_duplicate=False))
        tensors.update(model.named_buffers(remove_duplicate=False))
        g = self.model.graph
        vmap: dict[int, ir.Value] = {}
        new_inputs = []
        for v in self.token_inputs:
            vmap[id(v)] = _clone(v, v.name)
            new_inputs.append(vmap[id(v)])
        state_inputs: list[dict[int, ir.Value]] = []  # per layer: template input id -> its input
        for i, j in enumerate(kind_of):
            states = {}
            for v in g.inputs:
                if v.name.startswith(f"past.{j}."):
                    states[id(v)] = _clone(v, _state_rename(v.name, j, i))
                    new_inputs.append(states[id(v)])
            state_inputs.append(states)
        for node in self.prefix + self.tail:  # skeleton Shape nodes over a state input: over the model's
            for v in node.inputs:
                if v is not None and v.is_graph_input() and v not in self.token_inputs:
                    vmap[id(v)] = dim_source(node, new_inputs)
        initializers = []

        def add_init(v: ir.Value, name: str, tensor) -> ir.Value:
            meta = {k: val for k, val in v.metadata_props.items()
                    if k not in (ROLE_KEY, OWNER_KEY, EMBED_KEY, SCALAR_KEY)}
            want = v.metadata_props.get(SCALAR_KEY)
            if want is not None and _scalar_class_of(_numpy(tensor)) != want:
                raise StampError(f"{name} is a scalar {_scalar_class_of(_numpy(tensor))} where the traced "
                                 f"layer's is {want} (the optimizer rewrites x * 1 and x + 0)")
            new = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=tensor.shape, const_value=tensor,
                           metadata_props=meta)
            initializers.append(new)
            return new

        def weight(name: str):
            if name not in tensors:
                raise StampError(f"the model has no tensor {name}")
            return tensors[name]

        by_owner: dict[str, list[ir.Value]] = defaultdict(list)
        for v in g.initializers.values():
            by_owner[v.metadata_props[OWNER_KEY]].append(v)

        def materialize(owner: str, name_of, rename, vmap: dict) -> None:
            """New initializers for the template's initializers of `owner`, into vmap."""
            owned = by_owner[owner]
            recipes = [v.name for v in owned if v.metadata_props[ROLE_KEY] == RECIPE]
            computed = {}
            if recipes:
                leaves = {v.name: weight(rename(v.name)) for v in self.recipes.inputs if _owner_of(v.name) == owner}
                computed = self._run_recipes(leaves, recipes)
            for v in owned:
                role = v.metadata_props[ROLE_KEY]
                name = rename(v.name) if role == PARAM else name_of(v.name)
                if role == PARAM:
                    tensor = TorchTensor(weight(rename(v.name)), name=name)
                elif role == RECIPE:
                    tensor = ir.tensor(computed[v.name], name=name)
                else:
                    const = v.const_value
                    tensor = (const if const.dtype == ir.DataType.STRING
                              else ir.Tensor(_numpy(const), dtype=const.dtype, name=name))
                vmap[id(v)] = add_init(v, name, tensor)

        materialize("", lambda s: s, lambda s: s, vmap)  # the skeleton's
        nodes = [self._clone_node(n, vmap, n.name, lambda s: s) for n in self.prefix]
        stream = self.layers[0].stream_in
        stream_value = vmap[id(stream)]
        outputs_by_name: dict[str, ir.Value] = {}
        for i, j in enumerate(kind_of):
            layer = self.layers[j]
            rename = _renamer(j, i)
            lmap = dict(vmap)
            lmap[id(layer.stream_in)] = stream_value
            lmap.update(state_inputs[i])
            materialize(str(j), lambda s, i=i: f"layers.{i}.{s}", rename, lmap)
            for n in layer.nodes:
                new = self._clone_node(n, lmap, f"layers.{i}.{n.name}", rename, i, j)
                nodes.append(new)
            stream_value = lmap[id(layer.stream_out)]
            for v in layer.nodes:
                for out in v.outputs:
                    if out.is_graph_output():
                        outputs_by_name[_state_rename(out.name, j, i)] = lmap[id(out)]
        vmap[id(self.layers[-1].stream_out)] = stream_value
        nodes += [self._clone_node(n, vmap, n.name, lambda s: s) for n in self.tail]
        new_outputs = []
        for out in g.outputs:
            if self._layer_of_value(out) is None:
                new_outputs.append(vmap[id(out)])
        specs = model.state_specs()
        for s in specs:
            if s.output_name not in outputs_by_name:
                raise StampError(f"the template gives no {s.output_name}")
            new_outputs.append(outputs_by_name[s.output_name])
        want_inputs = [v.name for v in self.token_inputs] + [s.name for s in specs]
        if [v.name for v in new_inputs] != want_inputs:
            raise StampError(f"stamped inputs {[v.name for v in new_inputs]} differ from the model's {want_inputs}")
        graph = ir.Graph(new_inputs, new_outputs, nodes=nodes, initializers=initializers,
                         opset_imports=dict(g.opset_imports), name=g.name)
        return ir.Model(graph, ir_version=self.model.ir_version, producer_name=self.model.producer_name,
                        producer_version=self.model.producer_version)

    def _clone_node(self, n: ir.Node, vmap: dict, name: str, rename, i: int | None = None, j: int | None = None):
        inputs = []
        for v in n.inputs:
            if v is None:
                inputs.append(None)
            elif id(v) in vmap:
                inputs.append(vmap[id(v)])
            else:
                raise StampError(f"node {n.name} reads {v.name}, which the stamped graph has not made yet")
        outs = []
        for v in n.outputs:
            if v.is_graph_output() and i is not None:
                out_name = _state_rename(v.name, j, i)
            elif i is not None:
                out_name = f"layers.{i}.{v.name}"
            else:
                out_name = v.name
            new = _clone(v, out_name)
            vmap[id(v)] = new
            outs.append(new)
        meta = {k: rename(val) for k, val in n.metadata_props.items() if k != LAYER_KEY}
        return ir.Node(n.domain, n.op_type, inputs, list(n.attributes.values()), overload=n.overload,
                       num_outputs=len(outs), outputs=outs, version=n.version, name=name,
                       doc_string=n.doc_string, metadata_props=meta)


def _read_layer(node: ir.Node) -> int | None:
    """The layer of a node without module scope: that of the node outputs and state inputs it reads
    (StampError when they belong to different layers), None when it reads skeleton values only."""
    layers = set()
    for v in node.inputs:
        if v is None or v.is_initializer():
            continue
        if v.is_graph_input():
            m = re.match(r"^past\.(\d+)\.", v.name)
            layers.add(int(m.group(1)) if m else None)
        elif v.producer() is not None:
            tag = v.producer().metadata_props.get(LAYER_KEY)
            layers.add(int(tag) if tag else None)
    found = layers - {None}
    if len(found) > 1:
        raise StampError(f"node {node.name} ({node.op_type}) reads values of layers {sorted(found)}")
    return next(iter(found)) if found else None


def _scalar_class_of(array: np.ndarray) -> str:
    from gdn_export.onnx.kinds import scalar_class

    return scalar_class(float(np.asarray(array, dtype=np.float64).reshape(())))


def _owner_of(name: str) -> str:
    """The layer position (as text) whose weight `name` is, "" for a skeleton weight."""
    m = _LAYER_SCOPE.match(name)
    return m.group(1) if m else ""


def _clone(v: ir.Value, name: str) -> ir.Value:
    """A new value named `name` with v's type, shape (frozen, shared by every copy) and metadata."""
    shape = v.shape
    if shape is not None and not shape.frozen:
        shape = v.shape = ir.Shape(shape, frozen=True)
    return ir.Value(name=name, type=v.type, shape=shape, metadata_props=dict(v.metadata_props))


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a


def _recipe_graph(nodes: list[_ConeNode], outputs: list[str], model: ir.Model, folds: FoldLog,
                  tensors: dict) -> ir.Graph:
    """The recipe nodes as an ir.Graph: inputs the weights they read (typed, no data), the other
    constants they read as Constant nodes, outputs the folded initializers."""
    values: dict[str, ir.Value] = {}
    made = {o for n in nodes for o in n.outputs}
    inputs, ir_nodes = [], []
    for node in nodes:
        for name in node.inputs:
            if name is None or name in values or name in made:
                continue
            tensor = folds.read[name]
            if name in tensors:
                values[name] = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(list(tensor.shape)))
                inputs.append(values[name])
            else:
                const = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.Tensor(_numpy(tensor), dtype=tensor.dtype))],
                                outputs=[ir.Value(name=name)])
                ir_nodes.append(const)
                values[name] = const.outputs[0]
    for node in nodes:
        outs = [ir.Value(name=o) for o in node.outputs]
        ir_nodes.append(ir.Node(node.domain, node.op_type, [None if i is None else values[i] for i in node.inputs],
                                node.attributes, outputs=outs, num_outputs=len(outs)))
        for o in outs:
            values[o.name] = o
    return ir.Graph(inputs, [values[o] for o in outputs], nodes=ir_nodes,
                    opset_imports=dict(model.opset_imports), name="recipes")


def check_supported(model) -> None:
    """StampError unless `model` is a HybridForCausalLM (or subclass: the vision-language model's
    language model) whose layers hold tensors of their own (no tensor shared between two layers or
    a layer and the skeleton)."""
    from gdn_export.models.hybrid import HybridForCausalLM

    if not isinstance(model, HybridForCausalLM):
        raise StampError(f"{type(model).__name__} is not a HybridForCausalLM")
    owner: dict[int, str] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        where = _owner_of(name)
        if owner.setdefault(id(t), where) != where:
            raise StampError(f"{name} is shared with layer {owner[id(t)] or 'skeleton'} tensors")
