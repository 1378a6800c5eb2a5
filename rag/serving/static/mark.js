// Marks words in a passage for the user page and the expert view. Only text nodes and <mark> elements are made:
// a passage is never parsed as HTML, whatever it contains.
"use strict";

// The text lowercased with each run of whitespace made one space, and for each of its characters the index in `text`
// it came from (plus the end): the extractive answer joins a passage's wrapped lines with single spaces, so the
// answer is found in its passage only when line breaks and spacing are ignored on both sides.
function folded(text) {
  let chars = "";
  const from = [];
  let inSpace = false;
  for (let i = 0; i < text.length; i++) {
    if (/\s/u.test(text[i])) {
      if (!inSpace && chars) { chars += " "; from.push(i); }
      inSpace = true;
      continue;
    }
    inSpace = false;
    const lower = text[i].toLowerCase(); // may be longer than one unit ("İ"): each unit keeps its source index
    chars += lower;
    for (let j = 0; j < lower.length; j++) from.push(i);
  }
  from.push(text.length);
  return { chars, from };
}

// [start, end) of the answer inside the passage text, ignoring case and whitespace; null when it is not quoted.
function quotedRange(text, answer) {
  const needle = folded(answer).chars.trim();
  if (needle.length <= 3) return null;
  const haystack = folded(text);
  const at = haystack.chars.indexOf(needle);
  if (at < 0) return null;
  return [haystack.from[at], haystack.from[at + needle.length - 1] + 1];
}

// Marks the answer inside a passage when it is quoted from it, else the question's longer words.
function highlight(element, text, answer, question) {
  element.textContent = "";
  const ranges = [];
  const quoted = answer ? quotedRange(text, answer) : null;
  if (quoted) {
    ranges.push(quoted);
  } else {
    const words = new Set((question.toLowerCase().match(/[\p{L}\p{N}]{4,}/gu) || []));
    const re = /[\p{L}\p{N}]+/gu;
    let m;
    while ((m = re.exec(text)) !== null) if (words.has(m[0].toLowerCase())) ranges.push([m.index, m.index + m[0].length]);
  }
  let at = 0;
  for (const [start, end] of ranges) {
    element.append(text.slice(at, start));
    const mark = document.createElement("mark");
    mark.textContent = text.slice(start, end);
    element.append(mark);
    at = end;
  }
  element.append(text.slice(at));
}
