// The production instantiations of SegmentedRateLimiter, compiled once into the library so that
// users of the default template arguments do not compile its slow path in every translation unit.
#include "redlimit/limiter.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"

namespace redlimit {

template class SegmentedRateLimiter<RateLimiter, SteadyClock>;
template class SegmentedRateLimiter<RateLimiter, CoarseSteadyClock>;
template class SegmentedRateLimiter<Limiter, SteadyClock>;
template class SegmentedRateLimiter<Limiter, CoarseSteadyClock>;

}  // namespace redlimit
