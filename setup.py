"""Ships tf_otel-autostart.pth next to the package so TF_OTEL_ENABLED=1 works in any process."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tf_otel-autostart.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join("tf_otel", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithPth})
