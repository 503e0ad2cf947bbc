// The one Catch2 main shared by every unit-test binary, compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
