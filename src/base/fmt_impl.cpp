// fmt's compiled part, built once into libredlimit. The library's sources use fmt 9 as a
// compiled library (not FMT_HEADER_ONLY): each of them then instantiates only the formatting
// templates it uses, while the functions fmt keeps out of line (vformat, the float conversion,
// the locale hooks) are compiled here, once. Consumers still need neither fmt's headers nor
// -lfmt. Header-only fmt cost 2-4 s of -O2 compile time in every source file that formats
// (g++ 12: src/config/uri.cpp 7.0 s header-only, 2.9 s this way).
// With fmt 10 or later the build uses fmt header-only (CMakeLists.txt) and this file is empty.
#include <fmt/core.h>

#if !defined(FMT_HEADER_ONLY) && FMT_VERSION < 100000
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
// What format.h declares `extern template` and the float formatting calls out of line.
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
}  // namespace detail
FMT_END_NAMESPACE
#endif
