// The pickle opcodes torch.save's files use (protocol 2, plus the protocol 4 ones Python 3.8+
// may emit when asked). Names follow CPython's pickle module so that its documentation applies.
#pragma once

#include <cstdint>

namespace deepspeed::checkpoint::detail {

enum class Op : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  DUP = '2',
  BINFLOAT = 'G',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  NONE = 'N',
  BINPERSID = 'Q',
  REDUCE = 'R',
  BINSTRING = 'T',
  SHORT_BINSTRING = 'U',
  BINUNICODE = 'X',
  EMPTY_LIST = ']',
  APPEND = 'a',
  BUILD = 'b',
  GLOBAL = 'c',
  DICT = 'd',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  LIST = 'l',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  SETITEMS = 'u',
  EMPTY_DICT = '}',
  EMPTY_TUPLE = ')',
  // protocol 2
  PROTO = 0x80,
  NEWOBJ = 0x81,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  // protocol 3
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  // protocol 4
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  EMPTY_SET = 0x8f,
  ADDITEMS = 0x90,
  FROZENSET = 0x91,
  NEWOBJ_EX = 0x92,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

}  // namespace deepspeed::checkpoint::detail
