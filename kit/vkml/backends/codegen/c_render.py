"""The C renderer: lowered statements as one C function for the CPU tier.

The function takes ``void** in`` and ``void** out`` (contiguous buffers the
backend allocates) and returns 0, or an error code naming the primitive that
failed (a gather index out of range, say).
"""

from __future__ import annotations

from .lower import CTYPE, Loop, _Block, _If, _While

# No #include: parsing system headers is most of a small compile's time, so the few
# declarations generated code needs are written out here.
HELPERS = r"""
typedef signed char int8_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned int uint32_t; typedef unsigned long long uint64_t;
void* malloc(unsigned long); void free(void*);
double exp(double); double log(double); double sin(double); double cos(double); double tanh(double);
double sqrt(double); double fabs(double); double pow(double, double);
float expf(float); float logf(float); float sinf(float); float cosf(float); float tanhf(float);
float sqrtf(float); float fabsf(float); float powf(float, float);
#define NAN (__builtin_nanf(""))
#define INFINITY (__builtin_inff())

static inline double vk_max_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
static inline float vk_max_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
static inline double vk_min_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
static inline float vk_min_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
static inline double vk_sign_double(double a) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : a); }
static inline float vk_sign_float(float a) { return a > 0 ? 1.0f : (a < 0 ? -1.0f : a); }
#define VK_INT_HELPERS(T) \
static inline T vk_floordiv_##T(T a, T b) { if (b == 0) return 0; T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; } \
static inline T vk_ipow_##T(T a, T b) { T r = 1; if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b & 1) ? -1 : 1) : 0); while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
VK_INT_HELPERS(int32_t)
VK_INT_HELPERS(int64_t)
static inline uint8_t vk_floordiv_uint8_t(uint8_t a, uint8_t b) { return b ? a / b : 0; }
static inline uint8_t vk_ipow_uint8_t(uint8_t a, uint8_t b) { return b ? a : 1; }
"""


#: temporaries of at most this many elements live on the stack
STACK_LIMIT = 64


def render(lowering, stmts, n_in, in_types, n_out, out_types, name="vk_main"):
    lines = [HELPERS]
    lines += lowering.statics
    lines.append(f"int {name}(void** in, void** out, int64_t* info) {{")
    lines.append("    int err_ = 0; int* err = &err_; (void)err; (void)info;")
    for i, t in enumerate(in_types):
        lines.append(f"    {CTYPE[t]}* a{i} = ({CTYPE[t]}*)in[{i}];")
    for i, t in enumerate(out_types):
        lines.append(f"    {CTYPE[t]}* o{i} = ({CTYPE[t]}*)out[{i}];")
    for tname, ctype, count in lowering.temps:
        if count <= STACK_LIMIT:
            # small temporaries on the stack: their address never escapes, so the compiler keeps
            # them in registers (a scan's scalar carry)
            lines.append(f"    {ctype} {tname}[{count}];")
        else:
            lines.append(f"    {ctype}* {tname} = ({ctype}*)malloc(sizeof({ctype}) * {count});")
    _emit(stmts, lines, "    ")
    lines.append("    goto done;")
    lines.append("done:")
    for tname, _, count in lowering.temps:
        if count > STACK_LIMIT:
            lines.append(f"    free({tname});")
    lines.append("    return err_;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _emit(stmts, lines, ind):
    for s in stmts:
        if isinstance(s, str):
            lines.append(ind + s)
        elif isinstance(s, Loop):
            lines.append(f"{ind}for (int64_t {s.var} = 0; {s.var} < {s.extent}; {s.var}++) {{")
            _emit(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, _Block):
            lines.append(ind + "{")
            _emit(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, _If):
            head = f"if ({s.test}) {{" if s.first else (f"{s.test} {{")
            lines.append(ind + head)
            _emit(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, _While):
            lines.append(f"{ind}while ({s.test}) {{")
            _emit(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        else:
            raise TypeError(s)
