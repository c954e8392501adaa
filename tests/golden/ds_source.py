"""Loads one module of DeepSpeed's sources on its own (the golden scripts here run against a
checkout, DS_SRC=<checkout>/deepspeed, without importing DeepSpeed and its dependencies)."""
import importlib.util
import sys


def load(path, name, package=None):
    """Executes the file at `path` as module `name` (registered in sys.modules, so that later
    loads can import it), with `package` as its package for relative imports."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if package:
        module.__package__ = package
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
