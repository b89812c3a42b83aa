#ifndef KPOOL_HPP
#define KPOOL_HPP

/// @file
/// The umbrella header: everything KPool offers. Link the CMake target
/// KPool::kpool (header-only; it brings Kokkos) and include this header.
/// What KPool computes is described in docs/ (docs/README.md first); the
/// API at a glance is docs/api.md.

/// @namespace KPool
/// k-pool compression kernels of a k-pooled sparse-attention indexer, on
/// Kokkos: the writers (compress, ring_close, seed_tail, tail_update,
/// expand_topk), the serving steps (step, decode_step) and their state
/// (Ring, StepOutput, PoolCache), and KPool::Layer, which owns all of
/// one indexer layer's state. Every entry point takes the execution space
/// instance first and an Options last, checks its arguments before
/// launching anything (throwing InvalidArgument) and queues all its work
/// on that instance. KPool::Details holds the internals.

#include <KPool_Config.hpp>
#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>

#include <KPool_Layer.hpp>
#include <cache/KPool_PoolCache.hpp>
#include <pool/KPool_Compress.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/KPool_RingClose.hpp>
#include <pool/KPool_SeedTail.hpp>
#include <pool/KPool_Step.hpp>
#include <pool/KPool_StorePools.hpp>
#include <pool/KPool_TailUpdate.hpp>
#include <select/KPool_ExpandTopk.hpp>
#include <select/KPool_ScoreSelect.hpp>
#include <select/KPool_SelectTokens.hpp>
#include <score/KPool_Score.hpp>
#include <ranks/KPool_Communicator.hpp>
#include <ranks/KPool_ShardSelect.hpp>

// The retired forms, last (KPool_ENABLE_DEPRECATED; CHANGELOG.md).
#include <pool/KPool_deprecated.hpp>
#include <ranks/KPool_deprecated.hpp>
#include <select/KPool_deprecated.hpp>

#endif
