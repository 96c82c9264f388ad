-- d3-fleet (d3_router role): the fleet endpoint's reading of a request body, as vLLM reads it.
-- vLLM parses the body as JSON (Python's json module through pydantic): a key given twice keeps its LAST value, and a
-- key may be spelled with escapes ("mod\u0065l" is "model"). HAProxy's json_query returns the first match of the
-- literal key only, so a body with two "model" keys was routed by the first and answered by vLLM for the last. This
-- action reads the top-level object's keys with escapes decoded and sets, for the configuration's rules:
--   txn.d3_model  the value of the one top-level "model" key, when it is a string
--   txn.d3_body   ok | not_json (not one JSON object) | duplicate_model | no_model | model_not_string
-- It checks only what routing needs (the object's structure and its keys); vLLM validates the rest of the JSON.
-- The body's bytes are read as Python's json.loads(bytes) reads them (vLLM: FastAPI's request.json() is Starlette's
-- json.loads(await self.body()) for an application/json request): the encoding from the first bytes
-- (json.detect_encoding: a UTF-32, UTF-16 or UTF-8 byte-order mark, else the pattern of zero bytes in the first four,
-- else UTF-8), decoded with 'surrogatepass' (lone surrogates kept, a byte sequence that does not decode refused);
-- inside a string only U+0000-U+001F must be escaped (DEL, 0x7F, may stand as it is); \uD83D\uDE00 is one character.
-- API: HAProxy's doc/lua-api/index.rst (core.register_action, TXN.f:req_body, TXN.set_var), the same in 2.6 and 3.0;
-- Lua 5.3 (Debian 12's HAProxy 2.6) and 5.4 (Debian 13's 3.0): string.unpack, utf8.char, utf8.len.

local ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

-- the code point of the \uXXXX escape at s[k] (the backslash), or nil
local function escaped(s, k)
    local hex = s:sub(k + 2, k + 5)
    if s:sub(k, k + 1) == '\\u' and hex:match('^%x%x%x%x$') then return tonumber(hex, 16) end
    return nil
end

-- the string starting at s[i] == '"': its decoded text and the index after it; nil when it is not a JSON string
local function read_string(s, i)
    local parts, j = {}, i + 1
    while true do
        local k = s:find('["\\\0-\31]', j) -- JSON's control characters are U+0000-U+001F (DEL is not one)
        if not k then return nil end
        local c = s:sub(k, k)
        parts[#parts + 1] = s:sub(j, k - 1)
        if c == '"' then return table.concat(parts), k + 1 end
        if c ~= '\\' then return nil end -- a raw control character
        local e = s:sub(k + 1, k + 1)
        local u = escaped(s, k)
        if ESCAPES[e] then
            parts[#parts + 1] = ESCAPES[e]
            j = k + 2
        elseif u then
            j = k + 6
            local low = u >= 0xD800 and u <= 0xDBFF and escaped(s, j)
            if low and low >= 0xDC00 and low <= 0xDFFF then -- a surrogate pair: one character, as Python's json
                u = 0x10000 + (u - 0xD800) * 0x400 + (low - 0xDC00)
                j = j + 6
            end
            parts[#parts + 1] = utf8.char(u)
        else
            return nil
        end
    end
end

local function ws(s, i)
    return s:find('[^ \t\r\n]', i) or #s + 1 -- JSON's whitespace: space, tab, CR, LF (Python's json.decoder.WHITESPACE)
end

-- the index after the JSON string starting at s[i] == '"', its escapes checked as read_string checks them but not
-- decoded; nil when it is not a JSON string
local function skip_string(s, i)
    local j = i + 1
    while true do
        local k = s:find('["\\\0-\31]', j)
        if not k then return nil end
        local c = s:byte(k)
        if c == 34 then return k + 1 end -- '"'
        if c ~= 92 then return nil end -- a raw control character
        if ESCAPES[s:sub(k + 1, k + 1)] then
            j = k + 2
        elseif escaped(s, k) then
            j = k + 6 -- a surrogate's partner is the next escape, checked in its turn (a lone one is allowed)
        else
            return nil
        end
    end
end

-- the index after the key, its colon and the whitespace before the value, in an object at s[i]; nil when there is none
local function skip_key(s, i)
    if s:byte(i) ~= 34 then return nil end -- '"'
    i = skip_string(s, i)
    if not i then return nil end
    i = ws(s, i)
    if s:byte(i) ~= 58 then return nil end -- ':'
    return ws(s, i + 1)
end

-- Python's json (CPython's C scanner, _json.c) takes NaN, Infinity and -Infinity as numbers, spelled exactly so
local LITERALS = { t = 'true', f = 'false', n = 'null', N = 'NaN', I = 'Infinity' }
-- an integer of more digits than this is refused: CPython's int() from text is limited to 4300 digits by default
-- (sys.int_info.default_max_str_digits, Python 3.11 and 3.12: ValueError); a number with a fraction or an exponent is
-- a float and has no such limit
local MAX_INT_DIGITS = 4300

-- the index after the number or literal starting at s[i]; nil when there is none. JSON's number grammar as Python
-- reads it, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?, the longest such prefix: what follows is the caller's to
-- check (after "01" the "1" is neither a comma nor a closing bracket, as in Python)
local function skip_scalar(s, i)
    local j = s:match('^%-?%d+()', i) -- the integer part
    if not j then
        local c = s:sub(i, i)
        local literal = LITERALS[c]
        if literal then
            local after = i + #literal
            return s:sub(i, after - 1) == literal and after or nil
        end
        return c == '-' and s:sub(i + 1, i + 8) == 'Infinity' and i + 9 or nil
    end
    local digits = j - i
    if s:byte(i) == 45 then digits = digits - 1 end -- '-'
    -- a leading 0 is the whole integer part: Python reads the 0 and then finds a digit where a comma or a bracket must be
    if digits > 1 and s:byte(j - digits) == 48 then return nil end
    local c = s:byte(j)
    if c ~= 46 and c ~= 101 and c ~= 69 then -- neither '.' nor 'e' nor 'E': an integer
        return digits <= MAX_INT_DIGITS and j or nil
    end
    local k = s:match('^%.%d+()', j) or j
    return s:match('^[eE][%+%-]?%d+()', k) or k
end

-- How deep the reader nests, the top-level object counting 1: a body nested deeper is refused (not_json). Python's
-- json has no limit of its own: its C scanner recurses once a level and fails with RecursionError where the
-- interpreter says, not the body: on CPython 3.11.7 at the Python recursion limit (1000) less the frames already on
-- the stack (992 levels from a bare script, fewer under a server's deeper call stack; 4993 after
-- sys.setrecursionlimit(5000)), on 3.12.1 at its C recursion limit (1497 levels, whatever the Python limit and the
-- stack), on 3.13.0 at 9998. No fixed number can match that, so the reader stops well below all of them: a body
-- nested deeper than MAX_DEPTH is refused although vLLM might read it. D3's requests are a few levels deep (the state
-- and the questions: objects of objects of strings).
local MAX_DEPTH = 512

-- the index after the JSON value starting at s[i], a value of the top-level object; nil when there is none. It checks
-- the value as Python's json does (strings, numbers, literals, the commas and colons of arrays and objects) without
-- recursing: the containers open around the value are a stack of the bytes that close them, '}' or ']'.
local function skip_value(s, i)
    local closers, n = {}, 0
    while true do
        local c, after = s:byte(i), nil -- a value starts at s[i]
        if c == 123 or c == 91 then -- '{' or '['
            if n + 2 > MAX_DEPTH then return nil end -- the top-level object, the n open here and this one
            i = ws(s, i + 1)
            if s:byte(i) == c + 2 then -- '}' or ']' at once: empty
                after = i + 1
            else
                n = n + 1
                closers[n] = c + 2
                if c == 123 then
                    i = skip_key(s, i)
                    if not i then return nil end
                end
            end
        else
            after = (c == 34 and skip_string or skip_scalar)(s, i)
            if not after then return nil end
        end
        if after then -- a value ends before s[after]: close what it closes, until a comma starts the next value
            i = after
            while true do
                if n == 0 then return i end
                i = ws(s, i)
                local d = s:byte(i)
                if d == 44 then -- ','
                    i = ws(s, i + 1)
                    if closers[n] == 125 then
                        i = skip_key(s, i)
                        if not i then return nil end
                    end
                    break
                end
                if d ~= closers[n] then return nil end
                n = n - 1
                i = i + 1
            end
        end
    end
end

-- UTF-16 (2) or UTF-32 (4 bytes a unit) from s[i] as UTF-8, 'surrogatepass' as Python: a surrogate pair is one
-- character, a lone surrogate kept; nil for a truncated unit or a UTF-32 unit past U+10FFFF
local function from_units(s, i, size, big)
    if (#s - i + 1) % size ~= 0 then return nil end
    local format = (big and '>I' or '<I') .. size
    local out, k = {}, i
    while k <= #s do
        local u = string.unpack(format, s, k)
        k = k + size
        if u > 0x10FFFF then return nil end
        if size == 2 and u >= 0xD800 and u <= 0xDBFF and k <= #s then
            local low = string.unpack(format, s, k)
            if low >= 0xDC00 and low <= 0xDFFF then
                u = 0x10000 + (u - 0xD800) * 0x400 + (low - 0xDC00)
                k = k + 2
            end
        end
        out[#out + 1] = utf8.char(u)
    end
    return table.concat(out)
end

-- UTF-8 as Python decodes it with 'surrogatepass': well formed, at most U+10FFFF, encoded surrogates allowed (Lua 5.4's
-- utf8.len refuses those unless lax; 5.3's takes them and ignores the fourth argument)
local function utf8_ok(s)
    return not s:find('[\245-\255]') and not s:find('\244[\144-\191]') and utf8.len(s, 1, -1, true) ~= nil
end

-- the body as text (UTF-8), as Python's json.loads(bytes) decodes it (json.detect_encoding); nil when it does not decode
local function as_text(s)
    local b1, b2, b3, b4 = s:byte(1, 4)
    if s:sub(1, 4) == '\0\0\254\255' then return from_units(s, 5, 4, true) end -- UTF-32 byte-order marks
    if s:sub(1, 4) == '\255\254\0\0' then return from_units(s, 5, 4, false) end
    if s:sub(1, 2) == '\254\255' then return from_units(s, 3, 2, true) end -- UTF-16 byte-order marks
    if s:sub(1, 2) == '\255\254' then return from_units(s, 3, 2, false) end
    if s:sub(1, 3) == '\239\187\191' then -- UTF-8's byte-order mark ('utf-8-sig'): dropped
        s = s:sub(4)
    elseif #s >= 4 and b1 == 0 then
        return from_units(s, 1, b2 == 0 and 4 or 2, true)
    elseif #s >= 4 and b2 == 0 then
        return from_units(s, 1, (b3 == 0 and b4 == 0) and 4 or 2, false)
    elseif #s == 2 and (b1 == 0 or b2 == 0) then
        return from_units(s, 1, 2, b1 == 0)
    end
    return utf8_ok(s) and s or nil
end

-- (verdict, model) for a request body
local function read_model(body)
    local s = as_text(body)
    if not s then return 'not_json' end
    local i = ws(s, 1)
    if s:sub(i, i) ~= '{' then return 'not_json' end
    local count, model, is_string = 0, nil, false
    i = ws(s, i + 1)
    if s:sub(i, i) == '}' then
        i = i + 1
    else
        while true do
            if s:sub(i, i) ~= '"' then return 'not_json' end
            local key, after = read_string(s, i)
            if not key then return 'not_json' end
            i = ws(s, after)
            if s:sub(i, i) ~= ':' then return 'not_json' end
            i = ws(s, i + 1)
            local value_end = skip_value(s, i)
            if not value_end then return 'not_json' end
            if key == 'model' then
                count = count + 1
                is_string = s:sub(i, i) == '"'
                model = is_string and read_string(s, i) or nil
            end
            i = ws(s, value_end)
            local c = s:sub(i, i)
            if c == '}' then
                i = i + 1
                break
            end
            if c ~= ',' then return 'not_json' end
            i = ws(s, i + 1)
        end
    end
    if ws(s, i) <= #s then return 'not_json' end
    if count == 0 then return 'no_model' end
    if count > 1 then return 'duplicate_model' end
    if not is_string then return 'model_not_string' end
    return 'ok', model
end

core.register_action('d3_read_model', { 'http-req' }, function(txn)
    local verdict, model = read_model(txn.f:req_body() or '')
    txn:set_var('txn.d3_body', verdict)
    -- a model holding U+0000 names no served model, but HAProxy's `-m str` compares up to the first NUL
    -- (pat_match_str's tree lookup): "d3-lite\u0000x" matched d3-lite (the review of 2026-12-05); left unset, the
    -- request gets the router's unknown-model 404, as vLLM would answer it
    if model and not model:find('\0', 1, true) then txn:set_var('txn.d3_model', model) end
end, 0)
