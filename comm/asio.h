#pragma once
// Standalone Asio, for every file of pipit that uses it. Asio decides how it allocates handler
// memory (std::aligned_alloc or operator new) by whether a libstdc++ header was included
// before it; translation units that disagree free with the wrong function. A standard header
// first makes every unit agree.
#include <cstddef>

#include <asio.hpp>
