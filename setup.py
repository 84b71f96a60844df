"""The compiled part of the engine; everything else is declared in pyproject.toml.

(setuptools' pyproject ``ext-modules`` table is still experimental and warns on every build.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("stream_svm._pathcore", ["stream_svm/_pathcore.pyx"])])
