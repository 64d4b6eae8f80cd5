"""Faces: decode uploads, detect, align, mask, composite, paste back.

Modules, one job each (numpy, scipy, OpenCV, ONNX Runtime, Pillow and dlib; never torch):

* :mod:`~facefuse.face.imageio`: bytes -> RGB array with header-first limits; RGB -> PNG.
* :mod:`~facefuse.face.models`: the detector/landmark models shipped inside PyPI packages.
* :mod:`~facefuse.face.detect`: the main face through a cascade of detector stages.
* :mod:`~facefuse.face.landmarks`: eye and nose positions inside a face box.
* :mod:`~facefuse.face.geometry`: similarity transforms, the face ellipse, the crop box.
* :mod:`~facefuse.face.mask`: feathered face masks.
* :mod:`~facefuse.face.color`: L*a*b* colour transfer.
* :mod:`~facefuse.face.facemesh`: MediaPipe FaceMesh's 468 points (ONNX, shipped in data/).
* :mod:`~facefuse.face.expression` / :mod:`~facefuse.face.expression_fit`: the linear
  expression model (smile, mouth_open) on those points, fitted on the London training people.
* :mod:`~facefuse.face.expression_edit`: whose expression (B's by default) and the edits on top.
* :mod:`~facefuse.face.warp`: piecewise-affine warp; :mod:`~facefuse.face.select`: which faces
  of B (largest, all, the one like a reference).
* :mod:`~facefuse.face.fusion`: :func:`prepare_fusion`, :class:`FusionPlan`, :func:`paste_back`.
* :mod:`~facefuse.face.evaluate` / :mod:`~facefuse.face.commands`: ``facefuse face-eval``.
"""
