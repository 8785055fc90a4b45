"""Datasets registered into ppdet: YOLO-format data yamls and the YOLODataSet source, image stores and their
caches, COCO json with a cached parse."""
