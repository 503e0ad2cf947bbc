// Rows of x taken a tile at a time by a kernel whose tile height is a template parameter.
#pragma once

#include <cstdint>

namespace tophat::kernels {

namespace row_tiles_internal {
template <int kRows, typename Tile>
void Rest(int64_t rows, int64_t i0, const Tile& tile) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      tile.template operator()<kRows>(i0);
    } else {
      Rest<kRows - 1>(rows, i0, tile);
    }
  }
}
}  // namespace row_tiles_internal

// Rows [0, m) through tile.operator()<kTile>(i0) for each whole tile of kTile rows from i0,
// then the rows left (fewer than kTile) through tile.operator()<rows left>(i0).
template <int kTile, typename Tile>
void ForEachRowTile(int64_t m, const Tile& tile) {
  int64_t i0 = 0;
  for (; i0 + kTile <= m; i0 += kTile) tile.template operator()<kTile>(i0);
  row_tiles_internal::Rest<kTile - 1>(m - i0, i0, tile);
}

}  // namespace tophat::kernels
