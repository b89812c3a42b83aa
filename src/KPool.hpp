#ifndef KPOOL_HPP
#define KPOOL_HPP

/// KPool: k-pool compression kernels for a k-pooled sparse-attention
/// indexer, on Kokkos. See README.md and SEMANTICS.md.

#include <KPool_Config.hpp>
#include <KPool_Exceptions.hpp>
#include <KPool_Float8.hpp>
#include <KPool_Options.hpp>
#include <KPool_Types.hpp>

#include <KPool_Compress.hpp>
#include <KPool_ExpandTopk.hpp>
#include <KPool_PoolCache.hpp>
#include <KPool_Ring.hpp>
#include <KPool_RingClose.hpp>
#include <KPool_SeedTail.hpp>
#include <KPool_Step.hpp>
#include <KPool_StorePools.hpp>
#include <KPool_TailUpdate.hpp>

// The selection stage needs Kokkos Kernels (KPOOL_HAS_KOKKOSKERNELS).
#if KPOOL_HAS_KOKKOSKERNELS
#include <KPool_ScoreSelect.hpp>
#include <KPool_SelectTokens.hpp>
#endif

#endif
