// Marks words in a passage for the user page and the expert view. Only text nodes and <mark> elements are made:
// a passage is never parsed as HTML, whatever it contains.
"use strict";

// Marks the answer inside a passage when it is quoted from it, else the question's longer words.
function highlight(element, text, answer, question) {
  element.textContent = "";
  const lower = text.toLowerCase();
  let ranges = [];
  const quoted = answer && answer.length > 3 ? lower.indexOf(answer.toLowerCase()) : -1;
  if (quoted >= 0) {
    ranges.push([quoted, quoted + answer.length]);
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
