"""ppmulti: multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet."""

__version__ = "0.1.0"
