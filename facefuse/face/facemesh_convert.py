"""Convert MediaPipe's FaceMesh ``face_landmark.tflite`` to the ONNX graph facefuse ships.

A development tool, run once (its output is committed as
``facefuse/face/data/face_landmark.onnx``); the served code never imports it. It needs the
``tflite`` package (the TFLite flatbuffer schema, ``pip install tflite``), which is not a
dependency of facefuse. The general converters (tflite2onnx 0.4.1) fail on this graph, and it
has only seven operators (CONV_2D, DEPTHWISE_CONV_2D, PRELU, ADD, MAX_POOL_2D, PAD and the
fp16 DEQUANTIZE of its weights), so this writes the ONNX graph directly: NCHW inside, the fp16
weights stored as fp32, the input kept NHWC ``[1, 192, 192, 3]`` (RGB in [0, 1]) behind one
Transpose, outputs ``landmarks`` [1, 1404] (468 x (x, y, z) in input pixels) and ``presence``
[1, 1] (a logit).

    pip download --no-deps mediapipe==0.10.14 -d /tmp/mp && cd /tmp/mp && unzip -o *.whl \\
        mediapipe/modules/face_landmark/face_landmark.tflite
    python -m facefuse.face.facemesh_convert /tmp/mp/mediapipe/modules/face_landmark/\\
face_landmark.tflite facefuse/face/data/face_landmark.onnx
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32}


def convert(tflite_path: str, onnx_path: str) -> None:
    import tflite  # development-only dependency

    buf = open(tflite_path, "rb").read()
    model = tflite.Model.GetRootAsModel(buf, 0)
    graph = model.Subgraphs(0)
    op_names = {v: k for k, v in tflite.BuiltinOperator.__dict__.items() if not k.startswith("_")}

    def tensor_array(index: int) -> np.ndarray | None:
        tensor = graph.Tensors(index)
        data = model.Buffers(tensor.Buffer()).DataAsNumpy()
        if isinstance(data, int) or data is None or len(data) == 0:
            return None
        return np.frombuffer(data.tobytes(), _DTYPES[tensor.Type()]).reshape(tensor.ShapeAsNumpy())

    def name(index: int) -> str:
        return graph.Tensors(index).Name().decode()

    def shape(index: int) -> list[int]:
        return [int(v) for v in graph.Tensors(index).ShapeAsNumpy()]

    constants: dict[int, np.ndarray] = {}
    nodes, initializers = [], []
    counter = [0]

    def const(array: np.ndarray, hint: str) -> str:
        counter[0] += 1
        label = f"{hint}_{counter[0]}"
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), label))
        return label

    def same_pads(in_hw, kernel, stride, padding) -> list[int]:
        if padding == tflite.Padding.VALID:
            return [0, 0, 0, 0]
        pads = []
        for size, k, s in zip(in_hw, kernel, stride, strict=True):
            out = -(-size // s)
            pads.append(max((out - 1) * s + k - size, 0))
        return [pads[0] // 2, pads[1] // 2, pads[0] - pads[0] // 2, pads[1] - pads[1] // 2]

    def activation(output: str, fused: int) -> str:
        if fused == tflite.ActivationFunctionType.NONE:
            return output
        if fused == tflite.ActivationFunctionType.RELU:
            nodes.append(helper.make_node("Relu", [output + "_pre"], [output]))
            return output + "_pre"
        raise NotImplementedError(f"fused activation {fused}")

    graph_input = name(graph.Inputs(0))
    nchw_input = graph_input + "_nchw"
    nodes.append(helper.make_node("Transpose", [graph_input], [nchw_input], perm=[0, 3, 1, 2]))
    renamed = {graph.Inputs(0): nchw_input}

    def ref(index: int) -> str:
        return renamed.get(index, name(index))

    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        kind = op_names[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        ins = [op.Inputs(k) for k in range(op.InputsLength())]
        out = op.Outputs(0)
        if kind == "DEQUANTIZE":
            constants[out] = tensor_array(ins[0]).astype(np.float32)
            continue
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            opts_cls = tflite.Conv2DOptions if kind == "CONV_2D" else tflite.DepthwiseConv2DOptions
            opts = opts_cls()
            table = op.BuiltinOptions()
            opts.Init(table.Bytes, table.Pos)
            weight = constants.get(ins[1])
            if weight is None:
                weight = tensor_array(ins[1]).astype(np.float32)
            bias = constants.get(ins[2]) if len(ins) > 2 else None
            if bias is None and len(ins) > 2:
                bias = tensor_array(ins[2]).astype(np.float32)
            if kind == "CONV_2D":
                kernel = weight.transpose(0, 3, 1, 2)  # OHWI -> OIHW
                group = 1
            else:
                kernel = weight.transpose(3, 0, 1, 2)  # 1HW(C*m) -> (C*m)1HW
                group = shape(ins[0])[3]
                if opts.DepthMultiplier() != 1:
                    raise NotImplementedError("depth multiplier")
            stride = [opts.StrideH(), opts.StrideW()]
            if opts.DilationHFactor() != 1 or opts.DilationWFactor() != 1:
                raise NotImplementedError("dilation")
            in_hw = shape(ins[0])[1:3]
            pads = same_pads(in_hw, kernel.shape[2:], stride, opts.Padding())
            inputs = [ref(ins[0]), const(kernel, "w")]
            if bias is not None:
                inputs.append(const(bias, "b"))
            target = activation(name(out), opts.FusedActivationFunction())
            nodes.append(
                helper.make_node(
                    "Conv", inputs, [target], strides=stride, pads=pads, group=group,
                    kernel_shape=list(kernel.shape[2:]),
                )
            )  # fmt: skip
        elif kind == "PRELU":
            alpha = constants.get(ins[1])
            if alpha is None:
                alpha = tensor_array(ins[1]).astype(np.float32)
            alpha = alpha.reshape(-1)[:, None, None]
            nodes.append(
                helper.make_node("PRelu", [ref(ins[0]), const(alpha, "alpha")], [name(out)])
            )
        elif kind == "ADD":
            opts = tflite.AddOptions()
            table = op.BuiltinOptions()
            opts.Init(table.Bytes, table.Pos)
            target = activation(name(out), opts.FusedActivationFunction())
            nodes.append(helper.make_node("Add", [ref(ins[0]), ref(ins[1])], [target]))
        elif kind == "MAX_POOL_2D":
            opts = tflite.Pool2DOptions()
            table = op.BuiltinOptions()
            opts.Init(table.Bytes, table.Pos)
            kernel = [opts.FilterHeight(), opts.FilterWidth()]
            stride = [opts.StrideH(), opts.StrideW()]
            pads = same_pads(shape(ins[0])[1:3], kernel, stride, opts.Padding())
            target = activation(name(out), opts.FusedActivationFunction())
            nodes.append(
                helper.make_node(
                    "MaxPool", [ref(ins[0])], [target], kernel_shape=kernel, strides=stride,
                    pads=pads,
                )
            )  # fmt: skip
        elif kind == "PAD":
            paddings = tensor_array(ins[1]).astype(np.int64)  # [4, 2] NHWC (before, after)
            nchw = paddings[[0, 3, 1, 2]]
            pads = np.concatenate([nchw[:, 0], nchw[:, 1]])
            nodes.append(helper.make_node("Pad", [ref(ins[0]), const(pads, "pads")], [name(out)]))
        else:
            raise NotImplementedError(kind)

    outputs = []
    for label, index in (("landmarks", graph.Outputs(0)), ("presence", graph.Outputs(1))):
        count = int(np.prod(shape(index)))
        nodes.append(
            helper.make_node(
                "Reshape", [ref(index), const(np.array([1, count], np.int64), "shape")], [label]
            )
        )
        outputs.append(helper.make_tensor_value_info(label, TensorProto.FLOAT, [1, count]))
    onnx_graph = helper.make_graph(
        nodes,
        "mediapipe_face_landmark",
        [helper.make_tensor_value_info(graph_input, TensorProto.FLOAT, shape(graph.Inputs(0)))],
        outputs,
        initializers,
    )
    onnx_model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid("", 13)],
        producer_name="facefuse.face.facemesh_convert",
    )
    onnx_model.ir_version = 8
    onnx_model.doc_string = (
        "MediaPipe FaceMesh face_landmark.tflite (mediapipe 0.10.14 wheel), Apache-2.0, "
        "Copyright Google LLC; converted to ONNX by facefuse.face.facemesh_convert"
    )
    onnx.checker.check_model(onnx_model)
    onnx.save(onnx_model, onnx_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tflite")
    parser.add_argument("onnx")
    args = parser.parse_args(argv)
    convert(args.tflite, args.onnx)


if __name__ == "__main__":
    main()
