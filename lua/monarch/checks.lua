--- monarch.checks: the argument checks the tensor verbs share (tensor.lua, gpu.lua and
-- collective.lua): dtypes, shapes, reduce ops and collective options, each checked one way, with one
-- message. A leaf: it requires nothing. `level` is where an error points, as for error(): the caller
-- passes the level its own caller is at, as it would to error() itself.
local M = {}

--- The dtypes of tensors: name -> {ctype, size} (the kernels' mk_dtype names, host/core/dtype.c).
M.DTYPES = {
  f32 = { ctype = "float", size = 4 }, f64 = { ctype = "double", size = 8 },
  f16 = { ctype = "uint16_t", size = 2 }, bf16 = { ctype = "uint16_t", size = 2 },
  i32 = { ctype = "int32_t", size = 4 }, i64 = { ctype = "int64_t", size = 8 },
  u8 = { ctype = "uint8_t", size = 1 },
}
local DTYPE_LIST = "f32, f64, f16, bf16, i32, i64, u8"

M.MAX_DIMS = 8 -- dimensions of a tensor (MK_MAX_DIMS, kernels/monarch_kernel.h)

--- The spec of dtype ({ctype, size}); raises naming it if it is not one.
function M.dtype(dtype, level)
  local d = M.DTYPES[dtype]
  if not d then error("unknown dtype '" .. tostring(dtype) .. "' (" .. DTYPE_LIST .. ")", level + 1) end
  return d
end

--- Number of elements of a shape (a list of sizes).
function M.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

--- Checks the dtype and shape of a tensor to make on the procs; returns the shape as a list (one
-- number n is {n}).
function M.tensor_spec(dtype, shape, level)
  M.dtype(dtype, level + 1)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or #shape > M.MAX_DIMS then
    error("tensor shape must be a list of up to " .. M.MAX_DIMS .. " sizes", level + 1)
  end
  for i, s in ipairs(shape) do
    if type(s) ~= "number" or s < 0 or s ~= math.floor(s) then
      error(string.format("tensor shape entry %d must be a non-negative integer, got %s", i, tostring(s)), level + 1)
    end
  end
  return shape
end

--- The reduce ops of the collectives, CPU and NCCL alike (a product is left out on both).
M.REDUCE_OPS = { sum = true, max = true, min = true, avg = true }

--- Checks op, a reduce op of collective `what`.
function M.reduce_op(op, what, level)
  if not M.REDUCE_OPS[op] then
    error(string.format("%s: unknown op %s (sum, max, min, avg)", what, tostring(op)), level + 1)
  end
end

local COLLECTIVE_OPTIONS = { dim = "string", timeout = "number" }

--- Checks the options of collective `what`: nil or {dim = name, timeout = seconds}. Returns them ({} for nil).
function M.collective_opts(opts, what, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(what .. ": options must be a table like {dim = 'dp'}", level + 1) end
  for k, v in pairs(opts) do
    local want = COLLECTIVE_OPTIONS[k]
    if not want then error(what .. ": unknown option '" .. tostring(k) .. "' (known: dim, timeout)", level + 1) end
    if type(v) ~= want then error(what .. ": option " .. k .. " wants a " .. want, level + 1) end
  end
  return opts
end

return M
