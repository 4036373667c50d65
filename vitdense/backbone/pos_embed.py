"""Learned 1D position embeddings, resampled in 2D to each input's patch grid.

The paper (section 3.2, "fine-tuning and higher resolution") interpolates the pre-trained
position embeddings in 2D according to their location in the original image. We resample
with timm's `resample_abs_pos_embed` (bicubic, antialiased) so that our numbers are
identical to timm's `dynamic_img_size` path, and cache the result per grid size: at
inference the same few grid sizes recur for every batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import nn

GridSize = tuple[int, int]


class PosEmbed(nn.Module):
    """Learned absolute position embedding stored at a native grid, resampled on demand.

    The parameter is named `pos_embed` on the parent model (timm's state-dict name); this
    module only owns the resampling logic and its cache, so it holds a reference to it.

    Args:
        native_grid: (h, w) grid the stored table was trained for.
        num_prefix_tokens: leading entries of the table that belong to prefix tokens (class,
            distillation) and are never resampled; 0 for `no_embed_class` models.
        max_cache: how many resampled tables to keep (one per grid size, dtype, device).
    """

    def __init__(self, native_grid: GridSize, num_prefix_tokens: int, max_cache: int = 16) -> None:
        super().__init__()
        self.native_grid = native_grid
        self.num_prefix_tokens = num_prefix_tokens
        self.max_cache = max_cache
        self._cache: dict[tuple, torch.Tensor] = {}

    def resample(self, pos_embed: torch.Tensor, grid: GridSize) -> torch.Tensor:
        """Table for `grid`: [1, num_prefix_tokens + h * w, D].

        Cached only when no gradient will flow into the table (inference, or a frozen
        table): a cached tensor must not carry an autograd graph between steps. The key
        includes the parameter's version counter, so an optimizer step or a
        `load_state_dict` invalidates it.
        """
        if torch.compiler.is_exporting():  # sizes are symbolic: resample in the graph, for any grid
            return self.resample_traced(pos_embed, grid)
        grid = (int(grid[0]), int(grid[1]))
        if grid == self.native_grid:
            return pos_embed
        use_cache = not (torch.is_grad_enabled() and pos_embed.requires_grad)
        key = (grid, id(pos_embed), pos_embed._version, pos_embed.dtype, pos_embed.device)
        if use_cache and key in self._cache:
            return self._cache[key]
        out = resample_abs_pos_embed(
            pos_embed,
            new_size=list(grid),
            old_size=list(self.native_grid),
            num_prefix_tokens=self.num_prefix_tokens,
        )
        if use_cache:
            if len(self._cache) >= self.max_cache:
                self._cache.clear()
            out = self._cache[key] = out.detach()
        return out

    def resample_traced(self, pos_embed: torch.Tensor, grid: GridSize) -> torch.Tensor:
        """`resample` as operations on any (symbolic) grid, for `torch.export`: timm's
        interpolation (bicubic, antialiased, prefix entries kept), without its shortcut for
        an unchanged grid, which would fix the exported size."""
        if all(isinstance(g, int) for g in grid) and tuple(grid) == self.native_grid:
            return pos_embed  # a fixed export at the native size: the table as stored
        p = self.num_prefix_tokens
        prefix, table = pos_embed[:, :p], pos_embed[:, p:]
        h0, w0 = self.native_grid
        table = table.reshape(1, h0, w0, -1).permute(0, 3, 1, 2).float()
        table = F.interpolate(table, size=(grid[0], grid[1]), mode="bicubic", antialias=True, align_corners=False)
        table = table.permute(0, 2, 3, 1).flatten(1, 2).to(pos_embed.dtype)
        return torch.cat([prefix, table], 1) if p else table

    def __getstate__(self) -> dict:
        # copies (EMA, deepcopy, pickling for spawn) start with an empty cache
        state = self.__dict__.copy()
        state["_cache"] = {}
        return state

    def extra_repr(self) -> str:
        return f"native_grid={self.native_grid}, num_prefix_tokens={self.num_prefix_tokens}"


def sincos_2d(
    embed_dim: int,
    grid: GridSize,
    temperature: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Fixed 2D sine-cosine position embeddings [h * w, embed_dim], row-major over `grid`:
    MAE's `get_2d_sincos_pos_embed` for any (h, w) (MAE builds square grids only).

    As MAE's, the first half of the channels encodes the column and the second half the
    row, each as [sin(pos * omega), cos(pos * omega)] with omega_i = temperature^(-i / (D/4)).
    Absolute by index: position (r, c) means the same in every grid, so a padded batch
    needs no resampling. Computed in float64 (MAE: numpy) and cast.
    """
    if embed_dim % 4:
        raise ValueError(f"2D sine-cosine position embeddings need embed_dim divisible by 4, got {embed_dim}")
    quarter = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64, device=device) / quarter)
    rows, cols = torch.meshgrid(
        torch.arange(grid[0], dtype=torch.float64, device=device),
        torch.arange(grid[1], dtype=torch.float64, device=device),
        indexing="ij",
    )

    def embed_1d(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega[None]  # [h * w, D / 4]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([embed_1d(cols), embed_1d(rows)], dim=1).to(dtype)
