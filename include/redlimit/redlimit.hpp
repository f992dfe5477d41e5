// redlimit — umbrella header.
#pragma once

#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/clock.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/http.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/reservation.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit/smooth_rate_limiter.hpp"
