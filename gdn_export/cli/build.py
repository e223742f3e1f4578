"""`gdn-export build model.onnx -o model.engine`: a TensorRT engine with the gdn plugins."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.common import input_file, Progress, add_overwrite, add_plugins, add_quiet, check_at_least, output_file
from gdn_export.errors import InputError
from gdn_export.paths import check_free_space


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="build a TensorRT engine from an exported ONNX model",
                       description="Build a strongly typed TensorRT engine (tensorrt 10/11 if it "
                       "imports, else tensorrt_rtx) with the gdn custom nodes mapped to the plugins "
                       "of libgdn_plugins.so.")
    p.add_argument("onnx", help="the exported .onnx file")
    p.add_argument("-o", "--output", "--save-engine", dest="output", required=True,
                   help="path of the engine file to write")
    add_plugins(p, "the gdn nodes")
    for which in ("min", "opt", "max"):
        p.add_argument(f"--trt-{which}-shapes", nargs="+", default=[], metavar="NAME:[d0,...]",
                       help=f"{which} shapes of the prefill optimisation profile, e.g. input_ids:[1,1] "
                       "(default: from --max-batch, --max-prefill and the model's cache length)")
    p.add_argument("--max-batch", type=int, metavar="N", help="largest batch of both profiles (default 8)")
    p.add_argument("--max-prefill", type=int, metavar="N",
                   help="longest prompt chunk of the prefill profile (default min(512, cache length))")
    p.add_argument("--decode-batch", type=int, metavar="N",
                   help="batch the decode profile (seq = 1) is tuned for (default --max-batch)")
    p.add_argument("--workspace", type=int, metavar="MiB",
                   help="workspace memory pool limit (default: TensorRT's, the GPU's memory)")
    p.add_argument("--image-sizes", default="448x448", metavar="WxH,...",
                   help="vision-language exports: image sizes the engines take (default 448x448); "
                   "the vision engine <stem>.vision.engine is built beside the output")
    p.add_argument("--max-images", type=int, default=1, metavar="N",
                   help="vision-language exports: most images or videos (grid_thw rows) per call (default 1)")
    add_overwrite(p, "the engine file (and its .layers.json)")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.trt import kv_fp8, loader
    from gdn_export.trt.build import ENGINE_SUFFIXES, build_engine, check_buildable_form, check_exported, layers_path
    from gdn_export.trt.profile import onnx_metadata, parse_shape_specs

    if args.workspace is not None:
        check_at_least(args.workspace, 1, "--workspace (MiB)")
    if Path(args.output).suffix not in ENGINE_SUFFIXES:  # `run` tells an engine by its suffix
        raise InputError(f"-o {args.output}: an engine file name must end in {' / '.join(ENGINE_SUFFIXES)}")
    output = output_file(args.output, "-o", args, also=(layers_path(Path(args.output)),))
    onnx = Path(args.onnx)
    input_file(onnx, "ONNX file")
    check_exported(onnx)  # a graph of another exporter: named now, not by `run` after the build
    check_buildable_form(onnx)  # the ort form: before the vision engine of a vision-language file
    kv_fp8.check(onnx, onnx_metadata(onnx), loader.flavour())  # a cache this TensorRT cannot build
    # The engine holds the weights once more: about the size of the .onnx and its .data sidecar.
    weights = sum(f.stat().st_size for f in (onnx, onnx.with_name(onnx.name + ".data")) if f.is_file())
    check_free_space(output.parent, weights, f"-o {args.output}")
    shapes = {w: parse_shape_specs(getattr(args, f"trt_{w}_shapes"), f"--trt-{w}-shapes")
              for w in ("min", "opt", "max")}
    plugins = loader.find_plugins(args.plugins)  # missing: how to build it here, in one line
    loader.check_loads(plugins)  # before the first progress line
    progress = Progress("build", args.quiet)
    from gdn_export.vlm.detect import is_vlm_onnx

    if is_vlm_onnx(args.onnx):  # model.engine + model.vision.engine
        from gdn_export.vlm.build import build_vlm

        paths = build_vlm(args.onnx, args.output, image_sizes=args.image_sizes, max_images=args.max_images,
                          plugins=plugins, min_shapes=shapes["min"] or None,
                          opt_shapes=shapes["opt"] or None, max_shapes=shapes["max"] or None,
                          max_batch=args.max_batch, max_prefill=args.max_prefill,
                          decode_batch=args.decode_batch,
                          workspace=None if args.workspace is None else args.workspace << 20,
                          progress=progress, overwrite=args.overwrite)
        for path in paths:
            print(f"wrote {path}")
        return 0
    path = build_engine(args.onnx, args.output, plugins=plugins,
                        min_shapes=shapes["min"] or None, opt_shapes=shapes["opt"] or None,
                        max_shapes=shapes["max"] or None, max_batch=args.max_batch,
                        max_prefill=args.max_prefill, decode_batch=args.decode_batch,
                        workspace=None if args.workspace is None else args.workspace << 20,
                        progress=progress, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0
