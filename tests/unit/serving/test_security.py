"""Static security checks of the code that serves requests, and of the serve defaults.

- no unsafe deserialisation or code execution: pickle, torch.load, allow_pickle=True, builtin
  eval/exec, shell=True, trust_remote_code=True (scanned as code tokens, so a docstring that
  says "no pickle" does not count and a real call cannot hide in an odd spacing);
- weights load through safetensors only;
- the request handlers never open a path: file access in the Triton models happens only in
  ``initialize`` (paths from the model repository, never from a request);
- ``facefuse serve`` listens on loopback and restricts the admin APIs unless told otherwise.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("facefuse", "export", "client", "model_repository", "load_tests")


def python_files() -> list[Path]:
    files = [p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")]
    return sorted(p for p in files if ".venv" not in p.parts and "__pycache__" not in p.parts)


def code_tokens(path: Path) -> list[tokenize.TokenInfo]:
    """Tokens that are code: no comments, no strings (docstrings included), no layout."""
    skip = {
        tokenize.COMMENT,
        tokenize.STRING,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
    }
    skip |= {
        getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE") if hasattr(tokenize, n)
    }
    source = path.read_text(encoding="utf-8")
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]


def unsafe_uses(tokens: list[tokenize.TokenInfo]) -> list[str]:
    found = []
    text = [t.string for t in tokens]
    for i, word in enumerate(text):
        before = text[i - 1] if i else ""
        after = text[i + 1 : i + 3]
        problem = None
        if word in ("pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"):
            problem = f"{word} (unsafe deserialisation)"
        elif word == "load" and before == "." and i >= 2 and text[i - 2] == "torch":
            # allowed only with the restricted unpickler: weights_only=True in the same call
            call = text[i + 1 : i + 40]
            close = call.index(")") if ")" in call else len(call)
            safe = any(call[k : k + 3] == ["weights_only", "=", "True"] for k in range(close))
            problem = None if safe else "torch.load"
        elif word in ("allow_pickle", "shell", "trust_remote_code") and after == ["=", "True"]:
            problem = f"{word}=True"
        elif word in ("eval", "exec", "__import__") and before != "." and after[:1] == ["("]:
            problem = f"builtin {word}()"
        if problem:
            found.append(f"line {tokens[i].start[0]}: {problem}")
    return found


def test_scanner_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport torch\nx = torch . load('w.pt')\nnp.load(f, allow_pickle=True)\n"
        "subprocess.run(cmd, shell = True)\ny = eval('1')\nmodel.eval()\n"
        "'''no pickle here'''\n# torch.load in a comment\n"
    )
    found = " ".join(unsafe_uses(code_tokens(bad)))
    for expected in ("pickle", "torch.load", "allow_pickle=True", "shell=True", "builtin eval"):
        assert expected in found, (expected, found)
    assert found.count("pickle (") == 1  # the docstring and the comment are not code
    assert "eval" not in found.replace("builtin eval()", "")  # model.eval() is a method


def test_no_unsafe_deserialisation_or_code_execution():
    files = python_files()
    assert len(files) > 30, "scanned too few files: wrong root?"
    problems = {
        str(p.relative_to(ROOT)): uses for p in files if (uses := unsafe_uses(code_tokens(p)))
    }
    assert not problems, problems


def test_weights_load_through_safetensors_only():
    """Every model ``from_pretrained`` in the package passes use_safetensors=True (a
    tokenizer's from_pretrained reads JSON/BPE text, no weights)."""
    unchecked = []
    for path in python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = ast.unparse(function)
            for node in ast.walk(function):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "from_pretrained"
                ):
                    continue
                owner = ast.unparse(node.func.value)
                if owner.endswith("Tokenizer"):
                    continue
                explicit = any(
                    k.arg == "use_safetensors" and ast.unparse(k.value) == "True"
                    for k in node.keywords
                )
                via_kwargs = any(k.arg is None for k in node.keywords) and (
                    "{'use_safetensors': True}" in body
                )
                if not (explicit or via_kwargs):
                    unchecked.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)}")
    assert not unchecked, unchecked


FILE_ACCESS = {"open", "Path", "load_tokenizer", "open_session", "load", "read_text", "read_bytes"}


def _names_called(function: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "model_repository").glob("*/1/model.py"))
    + [
        ROOT / "facefuse" / "serving" / n
        for n in ("triton_io.py", "triton_onnx.py", "triton_pipeline.py", "triton_stages.py")
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_request_handlers_never_touch_files(path):
    """Only ``initialize`` opens files; what runs per request (execute, handle, helpers)
    has no file access at all, so no request field can name a path."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in (
            "initialize",
            "__init__",
            "_init_metrics",
        ):
            touched = _names_called(node) & FILE_ACCESS
            # PipelineManifest.load / load_tokenizer only appear in initialize
            assert not touched, f"{path.name}:{node.name} calls {sorted(touched)}"


def test_serve_defaults_are_loopback_and_restricted(tmp_path):
    import argparse

    from facefuse.serving import commands as server_commands
    from facefuse.serving.server import ADMIN_HEADER, LocalTritonServer, ServerConfig, TritonPaths

    parser = argparse.ArgumentParser()
    server_commands.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--repository", str(tmp_path)])
    assert not args.public and not args.unrestricted
    config = ServerConfig(repository=tmp_path)
    assert config.host == "127.0.0.1" and config.restrict_apis and len(config.admin_key) >= 32
    command = LocalTritonServer(config).command(TritonPaths(tmp_path))
    for flag in ("--http-address=", "--grpc-address=", "--metrics-address="):
        assert f"{flag}127.0.0.1" in command
    restricted = f"model-repository,shared-memory,trace,logging:{ADMIN_HEADER}={config.admin_key}"
    assert f"--http-restricted-api={restricted}" in command
    assert f"--grpc-restricted-protocol={restricted}" in command
    # another random key each time: no default secret exists
    assert ServerConfig(repository=tmp_path).admin_key != config.admin_key
    with pytest.raises(Exception, match="host"):
        ServerConfig(repository=tmp_path, host="10.0.0.5")
