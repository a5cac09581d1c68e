"""InfiniteMNIST-style data (Loosli et al.): digits under random affine and elastic deformations, grouped by client. The
federated task (examples.federated_mnist, research.federated_mnist) gives every client deformed copies of base images;
the deformations follow only their own seed, so the same clients come back for every run."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

IMAGE_SIZE = 28
_CHUNK = 8192


def deform(
    images: np.ndarray,
    rng: np.random.Generator,
    max_rotation_deg: float = 15.0,
    max_shear: float = 0.25,
    scale_range: tuple[float, float] = (0.85, 1.15),
    max_shift: float = 2.5,
    elastic_alpha: float = 2.0,
    elastic_sigma: float = 3.5,
) -> np.ndarray:
    """Random affine + elastic deformations of a batch of images [B, H, W] (values in [0, 1]), vectorised. Each output
    pixel samples the input (bilinearly, zero outside) at A (x - c) + c + shift + elastic(x), where A combines a
    rotation, a shear and a scaling, and the elastic field is uniform noise in [-1, 1] smoothed by a Gaussian of std
    `elastic_sigma` pixels and scaled to a largest displacement of `elastic_alpha` pixels."""
    batch, height, width = images.shape
    angle = np.deg2rad(rng.uniform(-max_rotation_deg, max_rotation_deg, batch))
    shear = rng.uniform(-max_shear, max_shear, batch)
    scale = rng.uniform(*scale_range, batch)
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    matrix = np.stack([np.stack([cos, -sin + shear * cos], -1), np.stack([sin, cos + shear * sin], -1)], -2)
    shift = rng.uniform(-max_shift, max_shift, (batch, 2))
    fields = ndimage.gaussian_filter(
        rng.uniform(-1, 1, (2, batch, height, width)), sigma=(0, 0, elastic_sigma, elastic_sigma)
    )
    fields *= elastic_alpha / np.maximum(np.abs(fields).max(axis=(2, 3), keepdims=True), 1e-12)
    rows, cols = np.meshgrid(np.arange(height) - (height - 1) / 2, np.arange(width) - (width - 1) / 2, indexing="ij")
    grid = np.stack([rows, cols], -1).reshape(1, -1, 2)
    source = np.einsum("bij,bpj->bpi", matrix, np.broadcast_to(grid, (batch,) + grid.shape[1:]))
    source_rows = source[..., 0].reshape(batch, height, width) + (height - 1) / 2 + shift[:, :1, None] + fields[0]
    source_cols = source[..., 1].reshape(batch, height, width) + (width - 1) / 2 + shift[:, 1:, None] + fields[1]
    return _bilinear(images, source_rows, source_cols)


def _bilinear(images: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    batch, height, width = images.shape
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))  # A zero border: samples outside the image read 0.
    rows, cols = np.clip(rows + 1, 0, height), np.clip(cols + 1, 0, width)
    row0, col0 = np.minimum(np.floor(rows).astype(np.int64), height), np.minimum(np.floor(cols).astype(np.int64), width)
    row_weight, col_weight = rows - row0, cols - col0
    flat = padded.reshape(-1)
    base = (np.arange(batch)[:, None, None] * (height + 2) + row0) * (width + 2) + col0

    def at(row_offset: int, col_offset: int) -> np.ndarray:
        return np.take(flat, base + row_offset * (width + 2) + col_offset)

    top = at(0, 0) * (1 - col_weight) + at(0, 1) * col_weight
    bottom = at(1, 0) * (1 - col_weight) + at(1, 1) * col_weight
    return top * (1 - row_weight) + bottom * row_weight


def generate_clients(
    base_images: np.ndarray, base_labels: np.ndarray, num_clients: int, images_per_client: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deformed copies of the base images, grouped by client.

    Returns:
      uint8 images [num_clients, images_per_client, 28, 28, 1] and int64 labels [num_clients, images_per_client];
      with images_per_client == 1 the client axis is dropped ([num_clients, 28, 28, 1] and [num_clients]).
    """
    rng, total = np.random.default_rng(seed), num_clients * images_per_client
    sources = rng.permutation(np.resize(np.arange(len(base_labels)), total))
    images = np.empty((total, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    for start in range(0, total, _CHUNK):
        chunk = sources[start : start + _CHUNK]
        deformed = deform(base_images[chunk, :, :, 0], rng)
        images[start : start + len(chunk)] = np.round(np.clip(deformed, 0, 1) * 255).astype(np.uint8)
    labels = base_labels[sources].astype(np.int64)
    if images_per_client == 1:
        return images[..., None], labels
    return (
        images.reshape(num_clients, images_per_client, IMAGE_SIZE, IMAGE_SIZE, 1),
        labels.reshape(num_clients, images_per_client),
    )
