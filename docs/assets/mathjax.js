// MathJax settings for pymdownx.arithmatex (generic mode): \( \) inline, \[ \] display
window.MathJax = {
  tex: { inline: [["\\(", "\\)"]], display: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
};
