"""Datasets registered into ppdet: YOLO-format data yamls and the YOLODataSet source."""
