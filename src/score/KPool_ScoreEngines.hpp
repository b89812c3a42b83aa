#ifndef KPOOL_SCORE_SCORE_ENGINES_HPP
#define KPOOL_SCORE_SCORE_ENGINES_HPP

/// @file
/// The score wing's engines, as the selection stage and KPool::score take
/// them (docs/indexer.md, "The scoring engines"): the queries prepared
/// once a chunk of rows (Details::launch_prepare_queries), then one
/// engine's launch writing a key per (query row, visible pool)
/// (Details::launch_score; ScoreEngine names the engines), and the keys
/// back as scores (Details::launch_scores, KPool::score's output). Their
/// code is in score/detail/, private to this wing.

#include <score/detail/KPool_ScoreLaunch.hpp>
#include <score/detail/KPool_ScoreOut.hpp>
#include <score/detail/KPool_ScorePrepare.hpp>

#endif
