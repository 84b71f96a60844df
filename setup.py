"""The compiled part of the engine; everything else is declared in pyproject.toml.

(setuptools' pyproject ``ext-modules`` table is still experimental and warns on every build.)
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """GCC and Clang may fuse a * b + c into one instruction (fused multiply-add, the default
    where the target has it, as on aarch64), which rounds once instead of twice: the kernel
    values would then differ in their last bits from SciPy's and from another machine's. The
    loops are written to give the same bits everywhere; keep the compiler to them."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for extension in self.extensions:
                extension.extra_compile_args.append("-ffp-contract=off")
        super().build_extensions()


setup(ext_modules=[Extension("stream_svm._pathcore", ["stream_svm/_pathcore.pyx"])],
      cmdclass={"build_ext": BuildExt})
