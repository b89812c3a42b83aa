#ifndef KPOOL_COMMON_EXCEPTIONS_HPP
#define KPOOL_COMMON_EXCEPTIONS_HPP

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace KPool {

/// @file
/// The one exception KPool throws for bad arguments.

/// Thrown by an entry point whose arguments break the contract, before
/// anything is launched: no output and no ring entry has been written
/// (docs/validation.md). what() reads
/// "KPool::ENTRY: argument 'NAME', row R: value V PROBLEM"
/// ("extent I" in place of the row for a shape error, nothing there for a
/// scalar), e.g. "KPool::step: argument 'slot_idx', row 3: value 9 is not
/// below max_slots = 8".
class InvalidArgument : public std::invalid_argument {
 public:
  /// Builds the message from its parts (KPool's entry points do this).
  /// @param entry_point the entry point, e.g. "KPool::step".
  /// @param argument the argument's name as the entry point spells it.
  /// @param where "row <r>", "extent <i>", or empty for a scalar.
  /// @param row the offending row, or -1.
  /// @param value the offending value, printed.
  /// @param problem what is wrong with it, e.g. "is not below max_slots = 8".
  InvalidArgument(std::string entry_point, std::string argument,
                  std::string where, std::int64_t row, std::string value,
                  std::string const& problem)
      : std::invalid_argument(compose(entry_point, argument, where, value,
                                      problem)),
        entry_point_(std::move(entry_point)),
        argument_(std::move(argument)),
        where_(std::move(where)),
        row_(row),
        value_(std::move(value)),
        problem_(problem) {}

  /// The entry point that threw.
  /// @return "KPool::compress", "KPool::step", ...
  std::string const& entry_point() const noexcept { return entry_point_; }
  /// The argument at fault.
  /// @return its name as the entry point spells it, e.g. "slot_idx".
  std::string const& argument() const noexcept { return argument_; }
  /// Where in the argument.
  /// @return the offending row (index into the argument), or -1 for a
  /// shape or scalar error.
  std::int64_t row() const noexcept { return row_; }
  /// What the argument held.
  /// @return the offending value, printed.
  std::string const& value() const noexcept { return value_; }
  /// Where in the argument, as the message says it.
  /// @return "row <r>", "extent <i>", ... or empty.
  std::string const& where() const noexcept { return where_; }
  /// What is wrong with the value.
  /// @return the message's last part, e.g. "is not below max_slots = 8".
  std::string const& problem() const noexcept { return problem_; }

 private:
  static std::string compose(std::string const& entry,
                             std::string const& argument,
                             std::string const& where,
                             std::string const& value,
                             std::string const& problem) {
    std::string s = entry + ": argument '" + argument + "'";
    if (!where.empty()) s += ", " + where;
    // A state rather than a value (e.g. no step has run) has none.
    return s + (value.empty() ? ": " : ": value " + value + " ") + problem;
  }

  std::string entry_point_;
  std::string argument_;
  std::string where_;
  std::int64_t row_;
  std::string value_;
  std::string problem_;
};

}  // namespace KPool

#endif
